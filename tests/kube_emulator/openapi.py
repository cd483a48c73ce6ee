"""OpenAPI v3 for the emulator: `/openapi/v3` (the index of group-versions) and
`/openapi/v3/api/v1`, `/openapi/v3/apis/GROUP/VERSION` (one document per group-version).

kubectl reads these before `kubectl apply` (and `create`, `replace`) with its default
`--validate=strict`: it sends `fieldValidation=Strict` and skips its own schema validation when
the group-version's document has, for the kind, a PATCH operation (tagged with
`x-kubernetes-group-version-kind`) that takes a `fieldValidation` query parameter; without a
document it fails ("failed to download openapi"). Its client-side apply also looks there for the
patch types a kind accepts and for a schema tagged with the kind to compute a strategic merge
patch from.

What is served:

- every resource with the `patch` verb gets its object path (`.../{name}`) with `get`, `patch`
  and `delete` operations, and its `status` path when it has the subresource; PATCH takes
  `dryRun`, `fieldManager`, `fieldValidation` and `force`, and the patch types kube-apiserver
  accepts (strategic merge patch for built-ins only, as for a real CRD);
- for a CRD's version, the component schema is the CRD's own `openAPIV3Schema` (plus
  `apiVersion`, `kind` and `metadata`), tagged with its kind, as kube-apiserver publishes it;
- for built-ins, the component schema is a placeholder (an object that keeps unknown fields),
  NOT tagged with the kind: kubectl then computes strategic merge patches from its compiled-in
  types, as it does without OpenAPI. `kubectl explain` of a built-in shows nothing useful.

The emulator accepts `fieldValidation` and ignores it (no unknown-field errors or warnings).

`OpenApi` is a mixin of `apiserver.ApiServer`, like `discovery.Discovery`.
"""

import copy
import hashlib
import json
from typing import Any

import kmock

from common import api_error

OPENAPI_VERSION = '3.0.0'
META = 'io.k8s.apimachinery.pkg.apis.meta.v1'
# Patch types as kube-apiserver lists them for a PATCH operation.
PATCH_TYPES = ('application/apply-patch+yaml', 'application/json-patch+json', 'application/merge-patch+json')
STRATEGIC_MERGE_PATCH = 'application/strategic-merge-patch+json'


def _query(name: str, description: str, type_: str = 'string') -> dict[str, Any]:
    return {'name': name, 'in': 'query', 'description': description,
            'schema': {'type': type_, 'uniqueItems': True}}


PATCH_PARAMETERS = [
    _query('dryRun', 'When present, indicates that modifications should not be persisted (All).'),
    _query('fieldManager', 'The name of the actor or entity making these changes.'),
    _query('fieldValidation', 'Ignore, Warn or Strict: how to treat unknown or duplicate fields. '
           'The Lifeguard kube emulator accepts and ignores it.'),
    _query('force', 'Force an apply request, taking fields from other managers.', 'boolean'),
]

# The metadata types the schemas refer to, as placeholders.
META_SCHEMAS = {
    f'{META}.ObjectMeta': {
        'type': 'object', 'x-kubernetes-preserve-unknown-fields': True,
        'description': 'Standard object metadata (placeholder: the emulator does not publish its fields).',
    },
    f'{META}.ListMeta': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
    f'{META}.Patch': {'type': 'object', 'description': 'A patch, in one of the accepted patch types.'},
    f'{META}.Status': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
}


def component_name(group: str, version: str, kind: str) -> str:
    """`io.k8s.api.core.v1.Pod`, `dev.lifeguard.v1alpha1.McpServerPolicy`: the group reversed, as
    kube-apiserver names the schemas of CRDs (its built-in names differ; nothing depends on them)."""
    if not group:
        return f'io.k8s.api.core.{version}.{kind}'
    return '.'.join(reversed(group.split('.'))) + f'.{version}.{kind}'


def gv_path(group: str, version: str) -> str:
    """The key of a group-version in the index: `api/v1`, `apis/apps/v1`."""
    return f'apis/{group}/{version}' if group else f'api/{version}'


class OpenApi:
    """The OpenAPI v3 endpoints of `apiserver.ApiServer` (see the module docstring)."""

    resources: Any  # kmock's resource registry, provided by the emulator

    def describe(self, resource: kmock.resource, namespaced_hint: bool) -> Any:
        raise NotImplementedError  # provided by the emulator

    def crd_version(self, resource: kmock.resource) -> dict[str, Any] | None:
        raise NotImplementedError  # provided by the emulator: the CRD's entry in spec.versions

    def _openapi_documents(self, only: str | None = None) -> dict[str, dict[str, Any]]:
        """`api/v1`, `apis/G/V` -> the group-version's document (only that of `only` if given)."""
        grouped: dict[tuple[str, str], list[Any]] = {}
        for resource in list(self.resources):
            group, version = resource.group or '', resource.version or ''
            if only is None or gv_path(group, version) == only:
                grouped.setdefault((group, version), []).append(resource)
        return {gv_path(group, version): self._openapi_document(group, version, resources)
                for (group, version), resources in grouped.items()}

    def _openapi_document(self, group: str, version: str, resources: list[kmock.resource]) -> dict[str, Any]:
        paths: dict[str, Any] = {}
        schemas: dict[str, Any] = copy.deepcopy(META_SCHEMAS)
        for resource in resources:
            info = self.resources[resource]
            if 'patch' not in (info.verbs or ()):
                continue
            kind = self.describe(resource, True)
            crd = self.crd_version(resource)
            name = component_name(group, version, kind.kind)
            schemas[name] = self._kind_schema(group, version, kind.kind, crd)
            prefix = f'/apis/{group}/{version}' if group else f'/api/{version}'
            if kind.namespaced:
                prefix += '/namespaces/{namespace}'
            item = f'{prefix}/{resource.plural}/{{name}}'
            paths[item] = self._item_path(group, version, kind, name, crd is None, kind.namespaced)
            if kind.status_subresource:
                paths[f'{item}/status'] = self._item_path(group, version, kind, name, crd is None,
                                                          kind.namespaced, 'status')
        return {
            'openapi': OPENAPI_VERSION,
            'info': {'title': 'Kubernetes (Lifeguard kube emulator)', 'version': 'unversioned'},
            'paths': paths,
            'components': {'schemas': schemas},
        }

    @staticmethod
    def _kind_schema(group: str, version: str, kind: str, crd: dict[str, Any] | None) -> dict[str, Any]:
        if crd is None:
            return {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True,
                    'description': f'{kind} (placeholder: the emulator does not publish built-in schemas).'}
        schema = copy.deepcopy(((crd.get('schema') or {}).get('openAPIV3Schema')) or {'type': 'object'})
        properties = schema.setdefault('properties', {})
        properties['apiVersion'] = {'type': 'string', 'description': 'APIVersion of this object.'}
        properties['kind'] = {'type': 'string', 'description': 'Kind of this object.'}
        properties['metadata'] = {'allOf': [{'$ref': f'#/components/schemas/{META}.ObjectMeta'}],
                                  'description': 'Standard object metadata.'}
        schema['x-kubernetes-group-version-kind'] = [{'group': group, 'version': version, 'kind': kind}]
        return schema

    @staticmethod
    def _item_path(group: str, version: str, kind: Any, schema_name: str, builtin: bool,
                   namespaced: bool, subresource: str | None = None) -> dict[str, Any]:
        gvk = {'group': group, 'version': version, 'kind': kind.kind}
        ref = {'schema': {'$ref': f'#/components/schemas/{schema_name}'}}
        what = f'{kind.kind}{" status" if subresource else ""}'
        operation_name = ''.join(part[:1].upper() + part[1:] for part in
                                 [*group.replace('.', '-').split('-'), version,
                                  'Namespaced' if namespaced else '', kind.kind,
                                  subresource or ''] if part)

        def operation(verb: str, description: str, **extra: Any) -> dict[str, Any]:
            return {
                'description': description,
                'operationId': f'{verb}{operation_name}',
                'responses': {'200': {'description': 'OK', 'content': {'application/json': ref}}},
                'x-kubernetes-action': verb,
                'x-kubernetes-group-version-kind': gvk,
                **extra,
            }

        patch_types = PATCH_TYPES + ((STRATEGIC_MERGE_PATCH,) if builtin else ())
        path: dict[str, Any] = {
            'get': operation('get', f'read the specified {what}'),
            'patch': operation('patch', f'partially update the specified {what}',
                               parameters=copy.deepcopy(PATCH_PARAMETERS),
                               requestBody={'required': True, 'content': {
                                   t: {'schema': {'$ref': f'#/components/schemas/{META}.Patch'}}
                                   for t in sorted(patch_types)}}),
            'parameters': [
                {'name': 'name', 'in': 'path', 'required': True, 'description': f'name of the {kind.kind}',
                 'schema': {'type': 'string', 'uniqueItems': True}},
            ],
        }
        if namespaced:
            path['parameters'].append({'name': 'namespace', 'in': 'path', 'required': True,
                                       'description': 'object name and auth scope',
                                       'schema': {'type': 'string', 'uniqueItems': True}})
        if not subresource:
            path['delete'] = operation('delete', f'delete a {kind.kind}')
            path['delete']['responses']['200']['content'] = {
                'application/json': {'schema': {'$ref': f'#/components/schemas/{META}.Status'}}}
        return path

    @staticmethod
    def _encoded(document: dict[str, Any]) -> tuple[bytes, str]:
        body = json.dumps(document, sort_keys=True).encode()
        return body, hashlib.sha512(body).hexdigest().upper()

    async def _serve_openapi_index(self, request: kmock.Request) -> Any:
        return {'paths': {
            path: {'serverRelativeURL': f'/openapi/v3/{path}?hash={self._encoded(document)[1]}'}
            for path, document in sorted(self._openapi_documents().items())
        }}

    async def _serve_openapi_document(self, request: kmock.Request) -> Any:
        path = request.url.path.removeprefix('/openapi/v3/').strip('/')
        document = self._openapi_documents(only=path).get(path)
        if document is None:
            raise api_error(404, 'NotFound', f'the server could not find the requested resource (OpenAPI {path})')
        body, digest = self._encoded(document)
        return kmock.Response(status=200, headers={'Content-Type': 'application/json', 'Etag': f'"{digest}"'},
                              payload=body)
