"""The expected host key of an adoption (``ssh_host_key_fingerprint``): every form an operator
copies (the fingerprint ``ssh-keygen -lf`` prints, its whole line, the public key line, a
known_hosts line) becomes the same ``SHA256:…``; anything else is refused. Against a real sshd:
tests/integration/test_nodes_adoption_hostkey.py."""

from __future__ import annotations

import subprocess

import pytest

from karios.common.contracts.nodes import AdoptNode, host_key_fingerprint


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> tuple[str, str, str]:
    """(public key line, `ssh-keygen -lf` line, its fingerprint) of a fresh RSA key."""
    path = tmp_path_factory.mktemp("hk") / "k"
    cmd = ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-C", "root@n1", "-f", str(path)]
    subprocess.run(cmd, check=True)
    lf = subprocess.run(
        ["ssh-keygen", "-lf", f"{path}.pub"], capture_output=True, text=True, check=True
    ).stdout
    return (path.with_suffix(".pub").read_text(), lf.strip(), lf.split()[1])


def test_every_copied_form_is_the_ssh_keygen_fingerprint(key):
    line, lf, fp = key
    assert fp.startswith("SHA256:") and len(fp) == 50
    for given in (fp, f"  {fp}\n", fp + "=", lf, line, line.strip().rsplit(" ", 1)[0], f"10.0.0.5 {line}"):
        assert host_key_fingerprint(given) == fp, given


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "SHA256:short",
        "MD5:16:27:ac:a5:76:28:2d:36:63:1b:56:4d:eb:df:a6:48",
        "ssh-ed25519 not-base64!",
        "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIKqA",  # an ed25519 blob under another type
        "hello world",
    ],
)
def test_anything_else_is_refused(bad):
    with pytest.raises(ValueError):
        host_key_fingerprint(bad)


def test_the_contract_carries_only_the_normal_form(key):
    _line, _lf, fp = key
    assert AdoptNode(node_ip="10.0.0.5", expected_host_key_fingerprint=fp).expected_host_key_fingerprint == fp
    with pytest.raises(ValueError):
        AdoptNode(node_ip="10.0.0.5", expected_host_key_fingerprint="ssh-ed25519 AAAA")
