"""An embedded Kubernetes control plane for development and tests (not for production)."""
