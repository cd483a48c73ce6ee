"""The objects the API server emulator stores, and the pure operations on them: server-written
metadata, RFC 7386 merge patches, the field paths server-side apply tracks, Secret `stringData`,
the Namespace name label, a TokenReview's user, and the `Kind` and `Change` records
(`apiserver.py` serves them; nothing here does IO).
"""

import base64
import copy
import datetime
from collections.abc import Iterable
from typing import Any

import attrs
import kmock

from admission import NAMESPACES

SECRETS = kmock.resource('', 'v1', 'secrets')
# The label kube-apiserver gives every Namespace (its name), which namespaceSelectors use.
NAMESPACE_NAME_LABEL = 'kubernetes.io/metadata.name'

# Metadata only the server writes; whatever a client sends for these is ignored.
SERVER_METADATA = ('uid', 'resourceVersion', 'generation', 'creationTimestamp',
                   'deletionTimestamp', 'deletionGracePeriodSeconds', 'managedFields')


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, `null` removes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def leaf_paths(value: Any, prefix: tuple[str, ...] = ()) -> Iterable[tuple[str, ...]]:
    """Paths of the non-object values in `value` (lists count as one value, as atomic lists)."""
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from leaf_paths(sub, prefix + (key,))
    elif prefix:
        yield prefix


def has_path(value: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return True


def remove_path(value: dict[str, Any], path: tuple[str, ...]) -> None:
    """Removes `path` from `value`, then every object the removal left empty."""
    parents = [value]
    for key in path[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return
        parents.append(child)
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if parents[depth] == {}:
            parents[depth - 1].pop(path[depth - 1], None)


def spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    """What `generation` tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ('metadata', 'status', 'apiVersion', 'kind')}


def encode_string_data(kind: 'Kind', obj: dict[str, Any]) -> dict[str, Any]:
    """A Secret's `stringData` goes into `data`, base64-encoded, as the API server stores it."""
    if kind.resource == SECRETS and isinstance(obj.get('stringData'), dict):
        data = obj.setdefault('data', {}) or {}
        for key, value in obj.pop('stringData').items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj['data'] = data
    return obj


def label_namespace(kind: 'Kind', obj: dict[str, Any]) -> dict[str, Any]:
    """A Namespace carries `kubernetes.io/metadata.name: <name>`, as kube-apiserver defaults it."""
    if kind.resource == NAMESPACES and obj['metadata'].get('name'):
        labels = obj['metadata'].get('labels')
        obj['metadata']['labels'] = dict(labels if isinstance(labels, dict) else {},
                                         **{NAMESPACE_NAME_LABEL: obj['metadata']['name']})
    return obj


def user_info(identity: dict[str, Any]) -> dict[str, Any]:
    """A token table entry as a TokenReview's (and an AdmissionReview's) `userInfo`."""
    user = {
        'username': identity.get('username', ''),
        'uid': identity.get('uid', ''),
        'groups': list(identity.get('groups') or ['system:authenticated']),
    }
    if identity.get('extra'):
        user['extra'] = copy.deepcopy(identity['extra'])
    return user


def version_of(obj: dict[str, Any] | None) -> str | None:
    return None if obj is None else obj['metadata'].get('resourceVersion')


def guess_kind(plural: str) -> str:
    singular = plural[:-3] + 'y' if plural.endswith('ies') else plural[:-1] if plural.endswith('s') else plural
    return singular[:1].upper() + singular[1:]


@attrs.frozen
class Kind:
    """What the emulator knows about one resource (group, version, plural)."""
    resource: kmock.resource
    kind: str
    namespaced: bool
    status_subresource: bool

    @property
    def api_version(self) -> str:
        group, version = self.resource.group, self.resource.version
        return f'{group}/{version}' if group else str(version)

    @property
    def qualified(self) -> str:
        """`plural.group`, as Kubernetes names a resource in messages (`pods` for the core)."""
        group = self.resource.group
        return f'{self.resource.plural}.{group}' if group else str(self.resource.plural)

    def details(self, name: str) -> dict[str, str]:
        return {'name': name, 'group': self.resource.group or '', 'kind': self.resource.plural or ''}


@attrs.frozen
class Change:
    """One entry of the event log: what watchers see, at which resourceVersion."""
    rv: int
    resource: kmock.resource
    namespace: str | None
    type: str
    object: dict[str, Any]
