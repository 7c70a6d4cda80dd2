"""What ``pip install '.[client]'`` puts into a user's environment: the client and the API's
models, and none of the operator, the trainer or the development harness."""

from __future__ import annotations

import subprocess

from kubectl_plugin import KubectlDdp


def test_the_distribution_installs_the_client_and_the_api_and_nothing_else(
    kubectl_ddp: KubectlDdp,
) -> None:
    python = kubectl_ddp.bin_dir / "python"
    probe = (
        "import importlib.util as u, json;"
        "print(json.dumps({p: u.find_spec(p) is not None for p in"
        " ('ddp_api', 'ddp_client', 'ddp_operator', 'ddp_trainer', 'ddp_devcluster')}))"
    )
    found = subprocess.run(
        [str(python), "-c", probe],
        env=kubectl_ddp.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == (
        '{"ddp_api": true, "ddp_client": true, "ddp_operator": false, "ddp_trainer": false,'
        ' "ddp_devcluster": false}'
    ), found.stdout
    scripts = sorted(
        p.name for p in kubectl_ddp.bin_dir.iterdir() if p.name.startswith(("ddp", "kubectl"))
    )
    assert scripts == ["kubectl-ddp"], scripts
    helped = kubectl_ddp("--help")
    assert helped.returncode == 0 and "submit" in helped.stdout, helped.stderr
