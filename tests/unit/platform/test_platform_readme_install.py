"""The README's install commands are the ones the real-node tests run.

`hack.node.chart.installed` runs the README's Install block itself (`readme_install`),
so a changed command is what the tests install with. These checks keep the block in the
shape that runner understands: kubectl and helm only, the token from the file the
runner substitutes, and the release and namespace the real-node tests then address.
"""

from __future__ import annotations

import re

from hack.node.chart import NAMESPACE, README, RELEASE, TOKEN_FILE, readme_install


def test_the_install_block_is_namespace_secret_crds_helm_install() -> None:
    commands = readme_install()
    assert [argv[0] for argv in commands] == ["kubectl", "kubectl", "kubectl", "helm"]
    namespace, secret, crds, helm = commands
    assert namespace == ["kubectl", "create", "namespace", NAMESPACE]
    assert secret[:6] == ["kubectl", "-n", NAMESPACE, "create", "secret", "generic"]
    assert f"--from-file=THUNDER_API_TOKEN={TOKEN_FILE}" in secret
    assert not [a for a in secret if a.startswith("--from-literal")], "no token on argv"
    assert crds == ["kubectl", "apply", "--server-side", "-f", "charts/thunder-device-plugin/crds/"]
    assert helm[:4] == ["helm", "install", RELEASE, "charts/thunder-device-plugin"]
    assert helm[4:] == ["--namespace", NAMESPACE]


def test_the_verify_step_is_the_helm_test_the_real_node_runs() -> None:
    verify = README.read_text().split("\nVerify:\n", 1)[1]
    assert f"helm test {RELEASE} -n {NAMESPACE}" in verify


def test_no_install_path_in_the_readme_puts_the_token_on_a_command_line() -> None:
    assert not re.search(r"--from-literal=THUNDER_API_TOKEN", README.read_text())
