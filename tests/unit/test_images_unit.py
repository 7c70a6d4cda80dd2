"""The decisions of ``make images`` (ddp_devcluster.images) without a container engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_devcluster import containers, images

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_the_mirror_is_the_one_apt_uses_for_the_suite() -> None:
    assert images.debian_mirror([DEB822]) == "http://deb.debian.org/debian"
    one_line = "# comment\ndeb-src http://src/debian bookworm main\n"
    one_line += "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n"
    assert images.debian_mirror(["", one_line]) == "http://mirror.example/debian"
    with pytest.raises(LookupError):
        images.debian_mirror([DEB822.replace("bookworm ", "trixie ")], suite="trixie-x")


def test_the_stand_in_keys_change_with_what_they_are_made_of() -> None:
    base = images.rootfs_key()
    assert base == images.rootfs_key(packages=reversed(images.PACKAGES))
    assert base != images.rootfs_key(packages=[*images.PACKAGES, "curl"])
    assert base != images.rootfs_key(suite="trixie")
    assert images.python_key(base) != images.python_key(base, ["ENV A=1"])
    assert images.uv_key("a" * 64) != images.uv_key("b" * 64)


def test_the_refs_follow_the_chart() -> None:
    values = {"image": {"repository": "r/op", "tag": ""}, "trainerImage": "r/tr:1"}
    assert images.image_refs(values, {"appVersion": "0.2.0"}) == {
        "operator": "r/op:0.2.0",
        "trainer": "r/tr:1",
    }
    values["image"] = {"repository": "r/op", "tag": "dev"}
    assert images.image_refs(values, {"appVersion": "0.2.0"})["operator"] == "r/op:dev"


def test_the_trainer_is_built_with_pypis_torch_for_cpu() -> None:
    by_name = {b.name: b for b in images.builds(images.default_refs())}
    assert dict(by_name["trainer"].build_args) == {"VARIANT": "cpu", "TORCH_SOURCE": "pypi"}
    assert by_name["operator"].build_args == ()
    text = by_name["trainer"].dockerfile.read_text()
    assert images.dockerfile_arg(text, "TORCH_SOURCE") == "pytorch-cpu"  # what users get
    assert images.dockerfile_arg(text, "VARIANT") == "cpu"


def test_buildah_progress_lines() -> None:
    assert images.step_progress("[2/3] STEP 5/5: RUN uv venv") == "[2/3] 5/5 RUN uv venv"
    assert images.step_progress("STEP 1/2: FROM x") == "1/2 FROM x"
    assert images.step_progress("Downloading torch") is None


def test_tls_bundle_is_mounted_only_where_the_machine_names_one(tmp_path: Path) -> None:
    assert images.tls_flags({}) == []
    assert images.tls_flags({"SSL_CERT_FILE": str(tmp_path / "missing.pem")}) == []
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    assert images.tls_flags({"SSL_CERT_FILE": str(bundle)}) == [
        "--volume",
        f"{bundle}:{images.CA_BUNDLE}:ro",
    ]


def test_podman_gets_the_projects_containers_conf_unless_one_is_set() -> None:
    assert containers.podman_env({})["CONTAINERS_CONF"] == str(containers.CONTAINERS_CONF)
    assert containers.podman_env({"CONTAINERS_CONF": "/x"})["CONTAINERS_CONF"] == "/x"
    conf = containers.CONTAINERS_CONF.read_text()
    assert "default_ulimits = []" in conf and 'runtime = "runc"' in conf
