"""Discovery for the emulator: `/api`, `/apis`, `/apis/G`, `/apis/G/V`, `/api/v1`, `/version` and
aggregated discovery v2, built from kmock's bundled built-in resources plus every registered CRD.

`Discovery` is a mixin of `apiserver.ApiServer`: kmock's emulator routes the discovery paths to
the `_serve_*` methods below, which read `self.resources` and `self.describe()`.
"""

from collections.abc import Iterable
from typing import Any

import kmock

from common import api_error, header

# What `/version` reports: the Kubernetes minor the project builds against (k8s-openapi v1_33).
SERVER_VERSION = {
    'major': '1',
    'minor': '33',
    'gitVersion': 'v1.33.0+lifeguard-emulator',
    'gitCommit': '0000000000000000000000000000000000000000',
    'gitTreeState': 'clean',
    'buildDate': '2025-04-23T00:00:00Z',
    'goVersion': 'go1.24.2',
    'compiler': 'gc',
    'platform': 'linux/amd64',
}

# The verbs discovery lists for every resource (what a real API server serves, not all of which
# the emulator implements: see README.md).
RESOURCE_VERBS = ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch']
SUBRESOURCE_VERBS = ['get', 'patch', 'update']



class Discovery:
    """The discovery endpoints of `apiserver.ApiServer` (see the module docstring)."""

    resources: Any  # kmock's resource registry, provided by the emulator

    def describe(self, resource: kmock.resource, namespaced_hint: bool) -> Any:
        raise NotImplementedError  # provided by the emulator

    def _served(self) -> dict[str, dict[str, list[Any]]]:
        """group -> version -> resources, in declaration order (the first version is preferred)."""
        groups: dict[str, dict[str, list[Any]]] = {}
        for resource in list(self.resources):
            kind = self.describe(resource, True)
            groups.setdefault(resource.group or '', {}).setdefault(resource.version or '', []).append(kind)
        return groups

    @staticmethod
    def _aggregated(request: kmock.Request) -> bool:
        return 'as=APIGroupDiscoveryList' in header(request, 'Accept')

    def _resource_entries(self, kinds: list[Any]) -> list[dict[str, Any]]:
        entries = []
        for kind in kinds:
            info = self.resources[kind.resource]
            entry: dict[str, Any] = {
                'name': kind.resource.plural, 'singularName': info.singular or kind.kind.lower(),
                'namespaced': kind.namespaced, 'kind': kind.kind,
                'verbs': sorted(info.verbs or RESOURCE_VERBS),
            }
            if info.shortnames:
                entry['shortNames'] = sorted(info.shortnames)
            if info.categories:
                entry['categories'] = sorted(info.categories)
            entries.append(entry)
            for sub in sorted(info.subresources):
                entries.append({
                    'name': f'{kind.resource.plural}/{sub}', 'singularName': '',
                    'namespaced': kind.namespaced, 'kind': kind.kind, 'verbs': SUBRESOURCE_VERBS,
                })
        return entries

    def _aggregated_group(self, group: str, versions: dict[str, list[Any]]) -> dict[str, Any]:
        return {
            'metadata': {'name': group} if group else {},
            'versions': [
                {
                    'version': version, 'freshness': 'Current',
                    'resources': [
                        {
                            'resource': kind.resource.plural,
                            'responseKind': {'group': group, 'version': version, 'kind': kind.kind},
                            'scope': 'Namespaced' if kind.namespaced else 'Cluster',
                            'singularResource': self.resources[kind.resource].singular or kind.kind.lower(),
                            'verbs': sorted(self.resources[kind.resource].verbs or RESOURCE_VERBS),
                            'shortNames': sorted(self.resources[kind.resource].shortnames),
                            'categories': sorted(self.resources[kind.resource].categories),
                            'subresources': [
                                {'subresource': sub,
                                 'responseKind': {'group': group, 'version': version, 'kind': kind.kind},
                                 'verbs': SUBRESOURCE_VERBS}
                                for sub in sorted(self.resources[kind.resource].subresources)
                            ],
                        }
                        for kind in kinds
                    ],
                }
                for version, kinds in versions.items()
            ],
        }

    def _aggregated_list(self, groups: dict[str, dict[str, list[Any]]]) -> Any:
        return kmock.Response(
            status=200,
            headers={'Content-Type': 'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList'},
            payload={
                'apiVersion': 'apidiscovery.k8s.io/v2', 'kind': 'APIGroupDiscoveryList', 'metadata': {},
                'items': [self._aggregated_group(g, v) for g, v in groups.items()],
            },
        )

    @staticmethod
    def _group_entry(group: str, versions: Iterable[str]) -> dict[str, Any]:
        listed = [{'groupVersion': f'{group}/{v}', 'version': v} for v in versions]
        return {'name': group, 'versions': listed, 'preferredVersion': listed[0]}

    async def _serve_root(self, request: kmock.Request) -> Any:
        paths = {'/api', '/api/v1', '/apis', '/version'}
        for group, versions in self._served().items():
            if group:
                paths.add(f'/apis/{group}')
                paths.update(f'/apis/{group}/{v}' for v in versions)
        return {'paths': sorted(paths)}

    async def _serve_server_version(self, request: kmock.Request) -> Any:
        return SERVER_VERSION

    async def _serve_api(self, request: kmock.Request) -> Any:
        if self._aggregated(request):
            return self._aggregated_list({g: v for g, v in self._served().items() if g == ''})
        host = header(request, 'Host') or '127.0.0.1'
        return {
            'kind': 'APIVersions', 'versions': ['v1'],
            'serverAddressByClientCIDRs': [{'clientCIDR': '0.0.0.0/0', 'serverAddress': host}],
        }

    async def _serve_apis(self, request: kmock.Request) -> Any:
        groups = {g: v for g, v in self._served().items() if g}
        if self._aggregated(request):
            return self._aggregated_list(groups)
        return {
            'apiVersion': 'v1', 'kind': 'APIGroupList',
            'groups': [self._group_entry(g, versions) for g, versions in groups.items()],
        }

    async def _serve_group(self, request: kmock.Request) -> Any:
        assert request.resource is not None
        group = request.resource.group or ''
        versions = self._served().get(group)
        if not group or not versions:
            raise api_error(404, 'NotFound', f'the server could not find the requested resource (group {group!r})')
        return {'apiVersion': 'v1', 'kind': 'APIGroup', **self._group_entry(group, versions)}

    async def _serve_version(self, request: kmock.Request) -> Any:
        assert request.resource is not None
        group, version = request.resource.group or '', request.resource.version or ''
        if version == '':
            return await self._serve_group(request)
        kinds = self._served().get(group, {}).get(version)
        if not kinds:
            raise api_error(404, 'NotFound', f'the server could not find the requested resource ({group}/{version})')
        return {
            'apiVersion': 'v1', 'kind': 'APIResourceList',
            'groupVersion': f'{group}/{version}' if group else version,
            'resources': self._resource_entries(kinds),
        }
