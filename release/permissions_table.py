"""The chart README's permissions table, from the chart's rendered RBAC and admission policies.

The chart is rendered with the project's helm (``helm template``, default values, the
``helm test`` hooks included) under placeholder names, so the table names what any
release gets: ``<release>``, ``<namespace>`` and ``<thunder.secretName>`` stand for the
release name, its namespace and that value. Each rule of each Role and ClusterRole is a
row, with the comment above it in the template as its reason, and the
ValidatingAdmissionPolicies that narrow the ServiceAccount's writes to those resources.
``release.helm_docs`` puts the result where ``README.tmpl.md`` says ``{{ permissions }}``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hack.cluster import binaries

RELEASE: Final = "tdprelease"
NAMESPACE: Final = "tdpnamespace"
SECRET: Final = "tdpsecret"
PLACEHOLDERS: Final = {
    RELEASE: "<release>",
    NAMESPACE: "<namespace>",
    SECRET: "<thunder.secretName>",
}
ROLE_KINDS: Final = ("ClusterRole", "Role")
POLICY_KIND: Final = "ValidatingAdmissionPolicy"
COMPONENT: Final = "app.kubernetes.io/component"
DAEMON_ONLY: Final = "!variables.isDaemon ||"
"""A validation of this form holds only the daemon's ServiceAccount."""
OTHERS_ONLY: Final = "variables.isDaemon || request.userInfo.username == variables.operatorUser ||"
"""A validation of this form holds everyone but the driver's two ServiceAccounts."""
ANYONE: Final = ("variables.isDaemon", "variables.operatorUser", "request.userInfo")
"""A validation naming none of these holds everyone alike (the driver included)."""


class PermissionsError(RuntimeError):
    """The chart did not render, or renders something the table cannot describe."""


@dataclass(frozen=True, slots=True)
class Rule:
    who: str
    scope: str
    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...]
    why: str


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    resources: tuple[str, ...]
    operations: tuple[str, ...]
    daemon: tuple[str, ...]
    others: tuple[str, ...]
    everyone: tuple[str, ...] = ()


def render_chart(chart: Path) -> str:
    """`helm template` of the chart with defaults, under the placeholder names."""
    cmd = [
        str(binaries() / "helm"),
        "template",
        RELEASE,
        str(chart),
        "--namespace",
        NAMESPACE,
        "--set",
        f"thunder.secretName={SECRET}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PermissionsError(f"helm template {chart} failed: {proc.stderr.strip()}")
    return proc.stdout


def _named(text: str) -> str:
    for token, shown in PLACEHOLDERS.items():
        text = text.replace(token, shown)
    return text


def _documents(rendered: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for text in re.split(r"^---\s*$", rendered, flags=re.MULTILINE):
        doc = yaml.safe_load(text)
        if isinstance(doc, dict):
            yield text, doc


def _comments(text: str) -> list[str]:
    """The comment above each rule of a role, in the order of its rules ("" for none)."""
    out: list[str] = []
    pending: list[str] = []
    in_rules = False
    for line in text.splitlines():
        if line.startswith("rules:"):
            in_rules = True
            continue
        if not in_rules:
            continue
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
        elif stripped.startswith("- "):
            out.append(" ".join(pending))
            pending = []
    return out


def rules(rendered: str) -> list[Rule]:
    found: list[Rule] = []
    for text, doc in _documents(rendered):
        if doc.get("kind") not in ROLE_KINDS:
            continue
        meta = doc["metadata"]
        who = str(meta.get("labels", {}).get(COMPONENT, meta["name"]))
        scope = "cluster" if doc["kind"] == "ClusterRole" else "release namespace"
        why = _comments(text)
        items = doc.get("rules") or []
        if len(why) != len(items):
            raise PermissionsError(f"{doc['kind']} {meta['name']}: rules and comments disagree")
        for rule, reason in zip(items, why, strict=True):
            groups = rule.get("apiGroups") or [""]
            if len(groups) != 1:
                raise PermissionsError(f"{meta['name']}: one API group per rule, got {groups}")
            found.append(
                Rule(
                    who=who,
                    scope=scope,
                    api_group=str(groups[0]),
                    resources=tuple(rule["resources"]),
                    verbs=tuple(rule["verbs"]),
                    names=tuple(_named(str(n)) for n in rule.get("resourceNames") or ()),
                    why=_named(reason),
                )
            )
    return found


def policies(rendered: str) -> list[Policy]:
    found: list[Policy] = []
    for _, doc in _documents(rendered):
        if doc.get("kind") != POLICY_KIND:
            continue
        spec = doc["spec"]
        resources: list[str] = []
        operations: list[str] = []
        for rule in spec["matchConstraints"]["resourceRules"]:
            resources += [r for r in rule["resources"] if r not in resources]
            operations += [o for o in rule["operations"] if o not in operations]
        daemon: list[str] = []
        others: list[str] = []
        everyone: list[str] = []
        for check in spec["validations"]:
            expression = " ".join(str(check["expression"]).split())
            message = _named(" ".join(str(check["message"]).split()))
            if expression.startswith(DAEMON_ONLY):
                daemon.append(message)
            elif expression.startswith(OTHERS_ONLY):
                others.append(message)
            elif not any(word in expression for word in ANYONE):
                everyone.append(message)
            else:
                raise PermissionsError(
                    f"{doc['metadata']['name']}: a validation holds neither the daemon alone "
                    f"nor everyone but the driver: {expression[:80]}"
                )
        found.append(
            Policy(
                name=_named(str(doc["metadata"]["name"])),
                resources=tuple(resources),
                operations=tuple(operations),
                daemon=tuple(daemon),
                others=tuple(others),
                everyone=tuple(everyone),
            )
        )
    return found


def _limits(rule: Rule, found: Sequence[Policy]) -> str:
    if rule.who != "daemon":
        return ""
    write = {"create", "update", "patch", "delete"}
    if not write & set(rule.verbs):
        return ""
    names = [f"`{p.name}`" for p in found if p.daemon and set(p.resources) & set(rule.resources)]
    return ", ".join(names)


def _cell(text: str) -> str:
    """Free text in a table cell: no column break, no HTML tag (`<claim>`)."""
    return text.replace("|", "\\|").replace("<", "\\<")


def table(found_rules: Sequence[Rule], found_policies: Sequence[Policy]) -> str:
    lines = [
        "| who | scope | API group | resources | verbs | only these names "
        "| narrowed by admission policy | why |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rule in found_rules:
        group = f"`{rule.api_group}`" if rule.api_group else "core"
        resources = ", ".join(f"`{r}`" for r in rule.resources)
        names = ", ".join(f"`{n}`" for n in rule.names)
        lines.append(
            f"| {rule.who} | {rule.scope} | {group} | {resources} | {', '.join(rule.verbs)} | "
            f"{names} | {_limits(rule, found_policies)} | {_cell(rule.why)} |"
        )
    return "\n".join(lines) + "\n"


def policy_list(found: Sequence[Policy]) -> str:
    lines: list[str] = []
    for policy in found:
        on = f"{', '.join(f'`{r}`' for r in policy.resources)}: {', '.join(policy.operations)}"
        held = []
        if policy.daemon:
            held.append("the daemon: " + "; ".join(_cell(m) for m in policy.daemon))
        if policy.others:
            held.append(
                "everyone but the driver's two ServiceAccounts: "
                + "; ".join(_cell(m) for m in policy.others)
            )
        if policy.everyone:
            held.append("everyone: " + "; ".join(_cell(m) for m in policy.everyone))
        lines.append(f"- `{policy.name}` ({on}). Holds " + ". Holds ".join(held) + ".")
    return "\n".join(lines) + "\n"


def section(chart: Path, rendered: str | None = None) -> str:
    """The generated permissions text for the chart README."""
    text = render_chart(chart) if rendered is None else rendered
    found_rules = rules(text)
    if not found_rules:
        raise PermissionsError(f"{chart} renders no Role or ClusterRole")
    found_policies = policies(text)
    out = [table(found_rules, found_policies)]
    if found_policies:
        out.append(
            "The ValidatingAdmissionPolicies the chart installs (with `rbac.create`), "
            "each bound to deny:\n"
        )
        out.append(policy_list(found_policies))
    return "\n".join(out)
