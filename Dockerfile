# The operator image: kopf and the operator, no torch. Build from the repository root:
#   docker build -t ddp-operator:0.1.0 .
# It installs exactly the pins of requirements/operator.lock (`make lock`, from pyproject's
# `operator` extra); tests/packaging/test_images.py installs the same file into a fresh virtual
# environment and imports the operator, so a broken pin fails there first.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_VERSION=0.13.9

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_NO_CACHE=1 UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1 UV_PYTHON_DOWNLOADS=never
COPY requirements/operator.lock /tmp/operator.lock
RUN uv venv --python /usr/local/bin/python3.11 /opt/venv \
    && uv pip sync --python /opt/venv/bin/python /tmp/operator.lock

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin ddp
COPY --from=build /opt/venv /opt/venv
# The operator and the vocabulary it shares with the trainer and the client (torch-free).
COPY operator/ddp_operator /opt/app/ddp_operator
COPY api/ddp_api /opt/app/ddp_api
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8080
# JSON log lines; /healthz on :8080 for the kubelet's probes. CMD holds the namespace flags
# (`-n NS` per watched namespace instead), which the Helm chart sets.
ENTRYPOINT ["kopf", "run", "--standalone", "--log-format=json", \
            "--liveness=http://0.0.0.0:8080/healthz", "-m", "ddp_operator.handlers"]
CMD ["--all-namespaces"]
