{{/* The name of every object: the release name unless overridden. */}}
{{- define "ddp-operator.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The ClusterRole of the namespaces' trainer account, and the admission policy (and its
binding) that confines it; the operator reads the name from DDP_TRAINER_POLICY. */}}
{{- define "ddp-operator.trainerPolicy" -}}
{{- include "ddp-operator.fullname" . | trunc 46 | trimSuffix "-" -}}-trainer-progress
{{- end -}}

{{- define "ddp-operator.serviceAccountName" -}}
{{- default (include "ddp-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "ddp-operator.selectorLabels" -}}
app.kubernetes.io/name: ddp-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ddp-operator.labels" -}}
{{ include "ddp-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The Lease that elects the acting replica: leaderElection.leaseName, else the full name. */}}
{{- define "ddp-operator.leaseName" -}}
{{- default (include "ddp-operator.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}
