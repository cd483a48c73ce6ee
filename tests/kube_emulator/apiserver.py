"""The Kubernetes API semantics kube-rs needs, layered on kmock's `KubernetesEmulator`.

kmock parses every request into a Kubernetes action (list, watch, fetch, create, update, delete)
with its resource, namespace, name and subresource, routes it through its DSL (so the test-only
endpoints below are plain kmock reactions), keeps objects with their history in
`kmock.objects`, fans events out to watchers on its `Bus`, ships the discovery data of the
built-in resources, and renders errors as `Status` objects. Its stock emulator stores request
bodies verbatim, merges patches naively and starts every watch from scratch; this module
replaces those handlers with the behaviour of a real API server that a kube-rs watcher,
reflector, `Controller` and status writer rely on:

- server-assigned `resourceVersion` (one counter for the whole server, like etcd's revision),
  `uid`, `creationTimestamp` and `generation` (bumped when anything but `metadata` and
  `status` changes);
- lists with `kind: <Kind>List`, `apiVersion` and `metadata.resourceVersion`; watches that
  resume after the `resourceVersion` they are given (the last `LOG_KEPT` events are kept; an
  older one gets `410 Gone`, as from a real API server), honour `timeoutSeconds` and
  `sendInitialEvents`, and see no event for a write that changed nothing;
- create (409 `AlreadyExists`), get (404 `NotFound`), delete (finalizers honoured), JSON merge,
  JSON and strategic-merge patches (the last one treated as a merge patch), and server-side
  apply that creates absent objects and forgets fields its manager stopped applying;
- the `status` subresource: writes to `.../status` change only `.status`, writes to the object
  itself leave `.status` alone (for resources that have the subresource);
- `authentication.k8s.io/v1` TokenReviews answered from a token table;
- discovery (`/api`, `/apis`, `/apis/G`, `/apis/G/V`, `/api/v1`, `/version`, aggregated
  discovery v2) built from kmock's bundled built-in resources plus every registered CRD.

What it does not do is listed in README.md next to this file.
"""

import asyncio
import base64
import collections
import copy
import datetime
import json
import re
import secrets
import string
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml

# The audience a TokenReview without `spec.audiences` is checked against, as the API server's own.
API_SERVER_AUDIENCE = 'https://kubernetes.default.svc.cluster.local'

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

# Changes kept for watches that resume from a resourceVersion. A watch from before them gets a
# 410 Gone (Expired) ERROR event, as from a real API server's watch cache, and the client lists
# again; only the latest version of each object is kept.
LOG_KEPT = 50_000
# Requests GET /__emulator/requests remembers (the newest).
REQUESTS_KEPT = 100_000

TOKEN_REVIEWS = kmock.resource('authentication.k8s.io', 'v1', 'tokenreviews')
CRDS = kmock.resource('apiextensions.k8s.io', 'v1', 'customresourcedefinitions')
SECRETS = kmock.resource('', 'v1', 'secrets')

MERGE_PATCH = 'application/merge-patch+json'
STRATEGIC_MERGE_PATCH = 'application/strategic-merge-patch+json'
JSON_PATCH = 'application/json-patch+json'
APPLY_PATCH = 'application/apply-patch+yaml'

# Metadata only the server writes; whatever a client sends for these is ignored.
SERVER_METADATA = ('uid', 'resourceVersion', 'generation', 'creationTimestamp',
                   'deletionTimestamp', 'deletionGracePeriodSeconds', 'managedFields')


def api_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """A failure the client receives as a `Status` object with this code and reason."""
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details or None)


def bad_request(message: str) -> kmock.KubernetesError:
    return api_error(400, 'BadRequest', message)


def header(request: kmock.Request, name: str) -> str:
    """A request header by case-insensitive name (kmock keeps them as the client spelled them)."""
    wanted = name.lower()
    return next((v for k, v in request.headers.items() if k.lower() == wanted), '')


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


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator with the semantics described in the module docstring."""

    # token -> {username, uid, groups, extra, audiences}
    tokens: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    # Every TokenReview as answered (spec and status), in arrival order.
    token_reviews: list[dict[str, Any]] = attrs.field(factory=list, init=False)

    _rv: int = attrs.field(default=100, init=False)
    _log: list[Change] = attrs.field(factory=list, init=False)
    # The resourceVersion of the newest change dropped from the log (a watch must resume later).
    _log_floor: int = attrs.field(default=0, init=False)
    # (resource, namespace, name, field manager, subresource) -> the fields last applied.
    _applied: dict[tuple[Any, ...], dict[str, Any]] = attrs.field(factory=dict, init=False)
    # Kinds of resources nothing declared, as their first created object named it.
    _seen_kinds: dict[kmock.resource, str] = attrs.field(factory=dict, init=False)
    # The last REQUESTS_KEPT requests received, oldest first, as GET /__emulator/requests shows
    # them.
    _request_summaries: collections.deque[dict[str, Any]] = attrs.field(
        factory=lambda: collections.deque(maxlen=REQUESTS_KEPT), init=False)

    def __attrs_post_init__(self) -> None:
        # kmock's emulator registers its handlers as fallbacks (`self._serve_list` and the
        # others resolve to the overrides below) and the discovery routes of its scaffold.
        super().__attrs_post_init__()
        self.resources.load_bundled()
        self.fallback['put'] << self._serve_replace
        self.fallback['delete'] << self._serve_unsupported  # deletecollection
        self.fallback['post'] << self._serve_unsupported  # POST to a subresource
        self['get /__emulator/tokens'] << (lambda: self.tokens)
        self['post /__emulator/tokens'] << self._update_tokens
        self['get /__emulator/tokenreviews'] << (lambda: self.token_reviews)
        self['get /__emulator/requests'] << self._request_log

    # --- plumbing -------------------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock routes a request by walking its whole request log once per route, and keeps
        # every request (body included) in that log and in the log of the route that served it:
        # every request would cost more time than the one before (hundreds of milliseconds
        # after a few thousand) and memory would grow with the traffic. No route here looks at
        # earlier requests, so the log kmock walks holds only the request being routed (kmock
        # appended it just before calling this), the routes' logs are emptied, and a summary of
        # the latest requests is kept here instead.
        self._request_summaries.append(self._summary(request))
        self._requests[:] = [request]
        try:
            # Skip the stock emulator's write interceptor: the handlers below change the store.
            return await kmock.RawHandler._handle(self, request)
        finally:
            for payload in self._payloads:
                payload._requests.clear()

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if not isinstance(exc, kmock.KubernetesError):
            traceback.print_exc(file=sys.stderr)
            return await super()._render_error(exc)
        reason = 'NotFound' if isinstance(exc, kmock.KubernetesNotFoundError) else exc.reason
        body = {
            'apiVersion': 'v1', 'kind': 'Status', 'metadata': {}, 'status': 'Failure',
            'message': exc.message, 'reason': reason, 'code': exc.status,
        }
        if exc.details:
            body['details'] = exc.details
        return aiohttp.web.json_response(body, status=exc.status)

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def describe(self, resource: kmock.resource, namespaced_hint: bool) -> Kind:
        if resource in self.resources:
            info = self.resources[resource]
            return Kind(
                resource=resource,
                kind=info.kind or self._seen_kinds.get(resource) or guess_kind(resource.plural or ''),
                namespaced=info.namespaced if info.namespaced is not None else namespaced_hint,
                status_subresource='status' in info.subresources,
            )
        return Kind(
            resource=resource,
            kind=self._seen_kinds.get(resource) or guess_kind(resource.plural or ''),
            namespaced=namespaced_hint,
            status_subresource=False,
        )

    def _kind_of(self, request: kmock.Request) -> Kind:
        assert request.resource is not None
        return self.describe(request.resource, request.namespace is not None)

    def _current(self, key: tuple[Any, ...]) -> dict[str, Any] | None:
        if key not in self.objects:
            return None
        stored = self.objects[key]
        return None if stored.deleted else stored.raw

    def _live_objects(self, resource: kmock.resource) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        found = [(key, stored.raw) for key, stored in self.objects.items()
                 if key[0] == resource and not stored.deleted]
        return sorted(found, key=lambda item: (item[0][1] or '', item[0][2]))

    async def _record(self, kind: Kind, key: tuple[Any, ...], event: str, obj: dict[str, Any]) -> None:
        """Stores `obj` under `key` (or marks it deleted) and tells the watchers; under the lock."""
        if event == 'DELETED':
            self.objects[key].delete()
            for applied in [k for k in self._applied if k[:3] == key]:
                del self._applied[applied]
        elif key in self.objects:
            self.objects[key].history.append(obj)
        else:
            self.objects[key] = obj
        del self.objects[key].history[:-1]  # only the latest version is read
        change = Change(rv=int(obj['metadata']['resourceVersion']), resource=kind.resource,
                        namespace=key[1], type=event, object=obj)
        self._log.append(change)
        if len(self._log) >= 2 * LOG_KEPT:
            self._log_floor = self._log[-LOG_KEPT - 1].rv
            del self._log[:-LOG_KEPT]
        await self._buses[kind.resource].put(change)
        if kind.resource == CRDS and event != 'DELETED':
            self.register_crd(obj)

    # --- reading --------------------------------------------------------------------------------

    @staticmethod
    def _selection(request: kmock.Request) -> dict[str, str]:
        """The field selector's terms; anything but `metadata.name`/`metadata.namespace` is refused."""
        if request.params.get('labelSelector'):
            raise bad_request(
                'the Lifeguard kube emulator does not implement label selectors '
                f'(labelSelector={request.params["labelSelector"]!r}); see tests/kube_emulator/README.md')
        if request.params.get('continue'):
            raise bad_request('the Lifeguard kube emulator does not paginate (got a continue token)')
        terms: dict[str, str] = {}
        for term in filter(None, request.params.get('fieldSelector', '').split(',')):
            match = re.fullmatch(r'(metadata\.name|metadata\.namespace)(?:==?)(.*)', term)
            if match is None:
                raise bad_request(
                    f'the Lifeguard kube emulator supports only metadata.name and metadata.namespace '
                    f'field selectors, not {term!r}')
            terms[match[1]] = match[2]
        if request.name is not None:
            terms['metadata.name'] = request.name
        if request.namespace is not None:
            terms['metadata.namespace'] = request.namespace
        return terms

    @staticmethod
    def _selects(terms: dict[str, str], obj: dict[str, Any]) -> bool:
        meta = obj.get('metadata', {})
        return all(meta.get(field.split('.', 1)[1], '') == value for field, value in terms.items())

    @staticmethod
    def _metadata_only(request: kmock.Request) -> bool:
        return 'as=PartialObjectMetadata' in header(request, 'Accept')

    @staticmethod
    def _as_metadata(obj: dict[str, Any]) -> dict[str, Any]:
        return {'apiVersion': 'meta.k8s.io/v1', 'kind': 'PartialObjectMetadata', 'metadata': obj['metadata']}

    async def _serve_list(self, request: kmock.Request) -> Any:
        assert request.resource is not None
        if request.resource.plural is None:  # /api/v1, /apis/G/V: discovery
            return await self._serve_version(request)
        kind = self._kind_of(request)
        terms = self._selection(request)
        metadata_only = self._metadata_only(request)
        async with self._lock:
            items = [obj for _, obj in self._live_objects(kind.resource) if self._selects(terms, obj)]
            rv = self._rv
        if metadata_only:
            return {
                'apiVersion': 'meta.k8s.io/v1', 'kind': 'PartialObjectMetadataList',
                'metadata': {'resourceVersion': str(rv)}, 'items': [self._as_metadata(o) for o in items],
            }
        return {
            'apiVersion': kind.api_version, 'kind': f'{kind.kind}List',
            'metadata': {'resourceVersion': str(rv)}, 'items': items,
        }

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        kind = self._kind_of(request)
        if request.subresource not in (None, 'status'):
            raise api_error(404, 'NotFound', f'the emulator has no {request.subresource!r} subresource')
        async with self._lock:
            obj = self._current((kind.resource, request.namespace, request.name))
        if obj is None:
            raise api_error(404, 'NotFound', f'{kind.qualified} "{request.name}" not found',
                            **kind.details(request.name or ''))
        return self._as_metadata(obj) if self._metadata_only(request) else obj

    async def _serve_watch(self, request: kmock.Request) -> Any:
        kind = self._kind_of(request)
        terms = self._selection(request)
        metadata_only = self._metadata_only(request)
        params = request.params
        try:
            timeout = min(float(params.get('timeoutSeconds') or 1800), 3600.0)
        except ValueError:
            raise bad_request(f'invalid timeoutSeconds {params["timeoutSeconds"]!r}')
        since = params.get('resourceVersion', '')
        if since not in ('', '0') and not since.isdigit():
            raise bad_request(f'invalid resourceVersion {since!r}')

        def visible(change: Change) -> bool:
            return change.resource == kind.resource and self._selects(terms, change.object)

        bus = self._buses[kind.resource]
        async with self._lock:
            if since not in ('', '0') and params.get('sendInitialEvents') != 'true' \
                    and int(since) < self._log_floor:
                return self._expired_watch(since)
            if since in ('', '0') or params.get('sendInitialEvents') == 'true':
                initial = [('ADDED', obj) for _, obj in self._live_objects(kind.resource)
                           if self._selects(terms, obj)]
            else:
                initial = [(c.type, c.object) for c in self._log if c.rv > int(since) and visible(c)]
            if params.get('sendInitialEvents') == 'true':
                initial.append(('BOOKMARK', {
                    'apiVersion': kind.api_version, 'kind': kind.kind,
                    'metadata': {'resourceVersion': str(self._rv),
                                 'annotations': {'k8s.io/initial-events-end': 'true'}},
                }))
            marker = await bus.mark()

        def event(type_: str, obj: dict[str, Any]) -> dict[str, Any]:
            shown = self._as_metadata(obj) if metadata_only and type_ != 'BOOKMARK' else obj
            return {'type': type_, 'object': shown}

        async def stream() -> AsyncIterator[Any]:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            live = bus.stream(since=marker)
            try:
                yield b''  # send the headers now: the client waits for them before it reads events
                for type_, obj in initial:
                    yield event(type_, obj)
                while (left := deadline - loop.time()) > 0:
                    # An event that reaches the bus just as the timeout cancels the wait can be
                    # lost to this stream, which ends right then; the client's next watch
                    # replays it from the log. (So no closing bookmark: it would skip it.)
                    try:
                        change = await asyncio.wait_for(anext(live), left)
                    except TimeoutError:
                        break
                    if visible(change):
                        yield event(change.type, change.object)
            finally:
                await live.aclose()
                await bus.unmark(marker)

        return kmock.Response(status=200, headers={'Content-Type': 'application/json'}, payload=stream())

    def _expired_watch(self, since: str) -> Any:
        """A watch whose resourceVersion is older than the log: one 410 ERROR event, then the end."""
        async def stream() -> AsyncIterator[Any]:
            yield {'type': 'ERROR', 'object': {
                'apiVersion': 'v1', 'kind': 'Status', 'metadata': {}, 'status': 'Failure',
                'reason': 'Expired', 'code': 410,
                'message': f'too old resource version: {since} ({self._log_floor + 1})',
            }}
        return kmock.Response(status=200, headers={'Content-Type': 'application/json'}, payload=stream())

    # --- writing --------------------------------------------------------------------------------

    def _body(self, request: kmock.Request) -> Any:
        if isinstance(request.data, (dict, list)):
            return request.data
        try:
            return yaml.safe_load(request.text) if request.text.strip() else None
        except yaml.YAMLError as e:
            raise bad_request(f'the request body is neither JSON nor YAML: {e}')

    def _learn_kind(self, request: kmock.Request, body: Any) -> Kind:
        """The request's resource, its kind taken from the body when nothing declared it."""
        assert request.resource is not None
        if (request.resource not in self.resources and isinstance(body, dict)
                and isinstance(body.get('kind'), str)):
            self._seen_kinds.setdefault(request.resource, body['kind'])
        return self._kind_of(request)

    @staticmethod
    def _check_type(kind: Kind, body: dict[str, Any], required: bool) -> None:
        for field, expected in (('apiVersion', kind.api_version), ('kind', kind.kind)):
            value = body.get(field)
            if value is None and required:
                raise bad_request(f'{field} must be set')
            if value is not None and value != expected:
                raise bad_request(
                    f'the {field} in the data ({value}) does not match the expected {field} ({expected})')

    async def _serve_create(self, request: kmock.Request) -> Any:
        kind = self._kind_of(request)
        body = self._body(request)
        if not isinstance(body, dict):
            raise bad_request('the request body must be a JSON object')
        if kind.resource == TOKEN_REVIEWS:
            return self._review_token(body)
        kind = self._learn_kind(request, body)
        self._check_type(kind, body, required=False)
        meta = body.get('metadata') or {}
        namespace = request.namespace or meta.get('namespace')
        if kind.namespaced and namespace is None:
            raise bad_request(f'{kind.qualified} are namespaced: the object needs a namespace')
        if request.namespace and meta.get('namespace') not in (None, request.namespace):
            raise bad_request('the namespace of the provided object does not match the namespace sent on the request')
        name = meta.get('name')
        if not name and meta.get('generateName'):
            suffix = ''.join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
            name = meta['generateName'] + suffix
        if not name:
            raise api_error(422, 'Invalid', 'name or generateName is required')
        key = (kind.resource, namespace if kind.namespaced else None, name)
        async with self._lock:
            if self._current(key) is not None:
                raise api_error(409, 'AlreadyExists', f'{kind.qualified} "{name}" already exists',
                                **kind.details(name))
            obj = self._new_object(kind, body, key)
            if not self._dry_run(request):
                await self._record(kind, key, 'ADDED', obj)
        return kmock.Response(status=201, payload=obj)

    def _new_object(self, kind: Kind, body: dict[str, Any], key: tuple[Any, ...]) -> dict[str, Any]:
        obj = encode_string_data(kind, copy.deepcopy(body))
        if kind.status_subresource:
            obj.pop('status', None)
        obj['apiVersion'] = kind.api_version
        obj['kind'] = kind.kind
        meta = obj.setdefault('metadata', {})
        for field in SERVER_METADATA:
            meta.pop(field, None)
        meta['name'] = key[2]
        if key[1] is not None:
            meta['namespace'] = key[1]
        else:
            meta.pop('namespace', None)
        meta['uid'] = str(uuid.uuid4())
        meta['generation'] = 1
        meta['creationTimestamp'] = now()
        meta['resourceVersion'] = str(self._next_rv())
        return obj

    @staticmethod
    def _dry_run(request: kmock.Request) -> bool:
        return request.params.get('dryRun') == 'All'

    async def _serve_update(self, request: kmock.Request) -> Any:
        if request.subresource not in (None, 'status'):
            raise api_error(404, 'NotFound', f'the emulator has no {request.subresource!r} subresource')
        content_type = header(request, 'Content-Type').split(';')[0].strip().lower()
        if content_type not in (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH, APPLY_PATCH):
            raise api_error(415, 'UnsupportedMediaType', f'the patch content type {content_type!r} is not supported')
        body = self._body(request)
        kind = self._learn_kind(request, body)
        manager = request.params.get('fieldManager')
        if content_type == APPLY_PATCH:
            if not isinstance(body, dict):
                raise bad_request('an apply patch must be an object')
            if not manager:
                raise bad_request('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch')
            self._check_type(kind, body, required=True)
        key = (kind.resource, request.namespace, request.name)
        status_only = request.subresource == 'status'
        async with self._lock:
            old = self._current(key)
            if old is None:
                if content_type != APPLY_PATCH or status_only:
                    raise api_error(404, 'NotFound', f'{kind.qualified} "{request.name}" not found',
                                    **kind.details(request.name or ''))
                # Server-side apply creates what does not exist yet.
                obj = self._new_object(kind, body, key)
                if not self._dry_run(request):
                    self._remember_applied(key, manager, request.subresource, body, kind)
                    await self._record(kind, key, 'ADDED', obj)
                return kmock.Response(status=201, payload=obj)

            if content_type == JSON_PATCH:
                if not isinstance(body, list):
                    raise bad_request('a JSON patch must be an array of operations')
                try:
                    patched = jsonpatch.apply_patch(old, body, in_place=False)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                    raise api_error(422, 'Invalid', f'the JSON patch does not apply: {e}')
            elif content_type == APPLY_PATCH:
                patched = self._apply(old, key, manager, request.subresource, body, kind)
            else:
                if not isinstance(body, dict):
                    raise bad_request('a merge patch must be an object')
                patched = merge_patch(old, body)
            if not isinstance(patched, dict):
                raise api_error(422, 'Invalid', 'the patch left no object')

            new = self._settle(kind, old, patched, status_only)
            if new == old:  # a no-op: no new resourceVersion, no event
                return kmock.Response(status=200, payload=old)
            meta = new['metadata']
            if spec_part(new) != spec_part(old):
                meta['generation'] = int(old['metadata'].get('generation', 1)) + 1
            meta['resourceVersion'] = str(self._next_rv())
            if self._dry_run(request):
                return kmock.Response(status=200, payload=new)
            if content_type == APPLY_PATCH:
                self._remember_applied(key, manager, request.subresource, body, kind)
            if meta.get('deletionTimestamp') and not meta.get('finalizers'):
                await self._record(kind, key, 'DELETED', new)  # the last finalizer is gone
            else:
                await self._record(kind, key, 'MODIFIED', new)
        return kmock.Response(status=200, payload=new)

    @staticmethod
    def _settle(kind: Kind, old: dict[str, Any], patched: dict[str, Any], status_only: bool) -> dict[str, Any]:
        """The stored object after a patch: server-owned fields kept, the status subresource isolated."""
        if status_only:
            new = copy.deepcopy(old)
            if 'status' in patched:
                new['status'] = patched['status']
            else:
                new.pop('status', None)
            return new
        new = encode_string_data(kind, copy.deepcopy(patched))
        if kind.status_subresource:
            if 'status' in old:
                new['status'] = copy.deepcopy(old['status'])
            else:
                new.pop('status', None)
        new['apiVersion'] = old['apiVersion']
        new['kind'] = old['kind']
        meta = new.get('metadata')
        if not isinstance(meta, dict):
            meta = new['metadata'] = {}
        for field in ('name', 'namespace') + SERVER_METADATA:
            if field in old['metadata']:
                meta[field] = old['metadata'][field]
            else:
                meta.pop(field, None)
        return new

    def _applied_part(self, subresource: str | None, body: dict[str, Any], kind: Kind) -> dict[str, Any]:
        """The fields an apply request sets at its endpoint (only `.status` at `/status`)."""
        if subresource == 'status':
            return {'status': copy.deepcopy(body['status'])} if 'status' in body else {}
        part = {k: copy.deepcopy(v) for k, v in body.items() if k not in ('apiVersion', 'kind')}
        if kind.status_subresource:
            part.pop('status', None)
        meta = part.get('metadata')
        if isinstance(meta, dict):
            meta = {k: v for k, v in meta.items() if k not in ('name', 'namespace') + SERVER_METADATA}
            if meta:
                part['metadata'] = meta
            else:
                part.pop('metadata')
        return part

    def _remember_applied(self, key: tuple[Any, ...], manager: str | None, subresource: str | None,
                          body: dict[str, Any], kind: Kind) -> None:
        self._applied[key + (manager, subresource)] = self._applied_part(subresource, body, kind)

    def _apply(self, old: dict[str, Any], key: tuple[Any, ...], manager: str | None,
               subresource: str | None, body: dict[str, Any], kind: Kind) -> dict[str, Any]:
        """Server-side apply, approximated: the manager's fields it no longer applies are removed,
        then what it applies is merged in (objects merge, lists and scalars replace)."""
        previous = self._applied.get(key + (manager, subresource), {})
        applied = self._applied_part(subresource, body, kind)
        result = copy.deepcopy(old)
        for path in leaf_paths(previous):
            if not has_path(applied, path):
                remove_path(result, path)
        return merge_patch(result, applied)

    async def _serve_delete(self, request: kmock.Request) -> Any:
        kind = self._kind_of(request)
        key = (kind.resource, request.namespace, request.name)
        async with self._lock:
            old = self._current(key)
            if old is None:
                raise api_error(404, 'NotFound', f'{kind.qualified} "{request.name}" not found',
                                **kind.details(request.name or ''))
            if old['metadata'].get('deletionTimestamp'):
                return kmock.Response(status=202, payload=old)  # already being deleted
            new = copy.deepcopy(old)
            meta = new['metadata']
            meta['resourceVersion'] = str(self._next_rv())
            if self._dry_run(request):
                return kmock.Response(status=200, payload=new)
            if meta.get('finalizers'):
                meta['deletionTimestamp'] = now()
                meta['deletionGracePeriodSeconds'] = 0
                await self._record(kind, key, 'MODIFIED', new)
                return kmock.Response(status=202, payload=new)
            await self._record(kind, key, 'DELETED', new)
        return kmock.Response(status=200, payload=new)

    async def _serve_replace(self, request: kmock.Request) -> Any:
        raise api_error(405, 'MethodNotAllowed',
                        'the Lifeguard kube emulator does not implement PUT (replace); use a patch')

    async def _serve_unsupported(self, request: kmock.Request) -> Any:
        if request.resource is None:
            raise kmock.KubernetesEndpointNotFoundError()
        what = f'{request.method.value} {request.url.path}'
        raise api_error(405, 'MethodNotAllowed',
                        f'the Lifeguard kube emulator does not implement {what} '
                        '(deletecollection and POST to subresources are not emulated)')

    # --- CustomResourceDefinitions --------------------------------------------------------------

    def register_crd(self, crd: dict[str, Any]) -> None:
        """Makes the CRD's served versions known to discovery, lists and the status subresource."""
        spec = crd.get('spec') or {}
        names = spec.get('names') or {}
        for version in spec.get('versions') or []:
            if not version.get('served', True):
                continue
            resource = kmock.resource(spec['group'], version['name'], names['plural'])
            self.resources[resource] = kmock.ResourceInfo(
                kind=names['kind'],
                singular=names.get('singular') or names['kind'].lower(),
                namespaced=spec.get('scope') == 'Namespaced',
                verbs=RESOURCE_VERBS,
                shortnames=names.get('shortNames') or [],
                categories=names.get('categories') or [],
                subresources=[s for s in ('status', 'scale') if s in (version.get('subresources') or {})],
            )

    async def install_crds(self, documents: Iterable[dict[str, Any]]) -> None:
        """Stores CRDs before the server serves (as if applied at cluster creation)."""
        kind = self.describe(CRDS, False)
        async with self._lock:
            for doc in documents:
                if not isinstance(doc, dict) or doc.get('kind') != 'CustomResourceDefinition':
                    continue
                key = (CRDS, None, doc['metadata']['name'])
                if self._current(key) is None:
                    await self._record(kind, key, 'ADDED', self._new_object(kind, doc, key))

    # --- TokenReview ----------------------------------------------------------------------------

    def _review_token(self, body: dict[str, Any]) -> Any:
        spec = body.get('spec') or {}
        token = spec.get('token')
        if not token:
            raise api_error(422, 'Invalid', 'TokenReview.authentication.k8s.io "" is invalid: spec.token: Required value')
        requested = list(spec.get('audiences') or [])
        identity = self.tokens.get(token)
        if identity is None:
            status: dict[str, Any] = {'authenticated': False, 'user': {},
                                      'error': '[invalid bearer token, token lookup failed]'}
        else:
            accepted = identity.get('audiences') or [API_SERVER_AUDIENCE]
            wanted = requested or [API_SERVER_AUDIENCE]
            if all(audience in accepted for audience in wanted):
                user = {
                    'username': identity.get('username', ''),
                    'uid': identity.get('uid', ''),
                    'groups': list(identity.get('groups') or ['system:authenticated']),
                }
                if identity.get('extra'):
                    user['extra'] = identity['extra']
                status = {'authenticated': True, 'user': user, 'audiences': wanted}
            else:
                status = {'authenticated': False, 'user': {},
                          'error': f'[invalid bearer token, token audiences {json.dumps(accepted)} '
                                   f'is invalid for the target audiences {json.dumps(wanted)}]'}
        review = {
            'apiVersion': 'authentication.k8s.io/v1', 'kind': 'TokenReview',
            'metadata': {'creationTimestamp': None},
            'spec': spec, 'status': status,
        }
        self.token_reviews.append(copy.deepcopy(review))
        return kmock.Response(status=201, payload=review)

    def _update_tokens(self, request: kmock.Request) -> Any:
        """`POST /__emulator/tokens` `{token: identity}`: adds or replaces; `{token: null}` removes."""
        changes = request.data
        if not isinstance(changes, dict):
            raise bad_request('expected a JSON object {token: identity or null}')
        for token, identity in changes.items():
            if identity is None:
                self.tokens.pop(token, None)
            else:
                self.tokens[token] = identity
        return {'tokens': len(self.tokens)}

    @staticmethod
    def _summary(r: kmock.Request) -> dict[str, Any]:
        return {'method': str(r.method.value if hasattr(r.method, 'value') else r.method),
                'path': r.url.path, 'query': dict(r.params),
                'contentType': header(r, 'Content-Type'), 'accept': header(r, 'Accept')}

    def _request_log(self) -> Any:
        return list(self._request_summaries)

    # --- discovery ------------------------------------------------------------------------------

    def _served(self) -> dict[str, dict[str, list[Kind]]]:
        """group -> version -> resources, in declaration order (the first version is preferred)."""
        groups: dict[str, dict[str, list[Kind]]] = {}
        for resource in list(self.resources):
            kind = self.describe(resource, True)
            groups.setdefault(resource.group or '', {}).setdefault(resource.version or '', []).append(kind)
        return groups

    @staticmethod
    def _aggregated(request: kmock.Request) -> bool:
        return 'as=APIGroupDiscoveryList' in header(request, 'Accept')

    def _resource_entries(self, kinds: list[Kind]) -> list[dict[str, Any]]:
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

    def _aggregated_group(self, group: str, versions: dict[str, list[Kind]]) -> dict[str, Any]:
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

    def _aggregated_list(self, groups: dict[str, dict[str, list[Kind]]]) -> Any:
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
