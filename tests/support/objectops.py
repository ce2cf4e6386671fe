"""What the apiserver does to plain objects: merge patches (RFC 7386), JSON patches
(RFC 6902), label and field selectors. Used by the in-memory apiserver of
:mod:`tests.support.fakekube`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any


class Refused(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise Refused(422, "Invalid", f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for token in tokens[:-1]:
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (KeyError, IndexError, ValueError, TypeError):
            raise Refused(422, "Invalid", f"path {path!r} does not exist") from None
    return node, tokens[-1]


def json_patch(doc: Any, operations: Iterable[Mapping[str, Any]]) -> Any:
    """RFC 6902: add, remove, replace, test, copy, move."""
    doc = copy.deepcopy(doc)
    for op in operations:
        kind, path = op.get("op"), str(op.get("path", ""))
        tokens = _pointer(path)
        if not tokens:
            raise Refused(422, "Invalid", "patching the whole document is not supported")
        if kind in ("copy", "move"):
            source = _pointer(str(op.get("from", "")))
            holder, last = _parent(doc, source, str(op.get("from")))
            value = _get(holder, last, str(op.get("from")))
            if kind == "move":
                _remove(holder, last, str(op.get("from")))
            op = {"op": "add", "path": path, "value": copy.deepcopy(value)}
            kind = "add"
        holder, last = _parent(doc, tokens, path)
        if kind == "test":
            if _get(holder, last, path) != op.get("value"):
                raise Refused(422, "Invalid", f"the test of {path!r} failed")
        elif kind == "remove":
            _remove(holder, last, path)
        elif kind == "replace":
            _get(holder, last, path)
            _set(holder, last, op.get("value"), path, insert=False)
        elif kind == "add":
            _set(holder, last, copy.deepcopy(op.get("value")), path, insert=True)
        else:
            raise Refused(422, "Invalid", f"unknown JSON patch operation {kind!r}")
    return doc


def _get(holder: Any, last: str, path: str) -> Any:
    try:
        return holder[int(last)] if isinstance(holder, list) else holder[last]
    except (KeyError, IndexError, ValueError, TypeError):
        raise Refused(422, "Invalid", f"path {path!r} does not exist") from None


def _remove(holder: Any, last: str, path: str) -> None:
    _get(holder, last, path)
    if isinstance(holder, list):
        del holder[int(last)]
    else:
        del holder[last]


def _set(holder: Any, last: str, value: Any, path: str, *, insert: bool) -> None:
    if isinstance(holder, list):
        if last == "-" and insert:
            holder.append(value)
            return
        try:
            index = int(last)
        except ValueError:
            raise Refused(422, "Invalid", f"bad array index in {path!r}") from None
        if not 0 <= index <= len(holder) - (0 if insert else 1):
            raise Refused(422, "Invalid", f"index out of range in {path!r}")
        if insert:
            holder.insert(index, value)
        else:
            holder[index] = value
    elif isinstance(holder, dict):
        holder[last] = value
    else:
        raise Refused(422, "Invalid", f"path {path!r} does not exist")


_REQUIREMENT = re.compile(r"\s*([^,\s]+\s+(?:notin|in)\s+\([^)]*\)|[^,]+)\s*(?:,|$)")


def label_matches(labels: Mapping[str, str], selector: str) -> bool:
    """Whether labels satisfy a label selector string."""
    for match in _REQUIREMENT.finditer(selector):
        term = match.group(1).strip()
        if not term:
            continue
        set_term = re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term)
        if set_term:
            key, op, values = set_term.groups()
            wanted = {v.strip() for v in values.split(",") if v.strip()}
            inside = key in labels and labels[key] in wanted
            if inside != (op == "in"):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_matches(obj: Mapping[str, Any], selector: str) -> bool:
    """Whether an object satisfies an equality field selector (``a.b=v``, ``a.b!=v``)."""
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        negate = "!=" in term
        key, value = term.split("!=" if negate else "=", 1)
        node: Any = obj
        for part in key.replace("==", "").strip().split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        found = "" if node is None else str(node)
        if (found == value.lstrip("=").strip()) == negate:
            return False
    return True
