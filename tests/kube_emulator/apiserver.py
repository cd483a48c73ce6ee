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
- admission webhooks on every write (`admission.py`): the mutated object is what is stored;
- discovery (`discovery.py`), OpenAPI v3 (`openapi.py`) and Tables for `kubectl get` (`tables.py`).

Admission calls webhooks, which may read from this server meanwhile, so a write is prepared
under the lock, admitted without it, then committed under the lock again if the object did not
change in between (otherwise prepared again, as kube-apiserver retries a patch).

What it does not do is listed in README.md next to this file.
"""

import asyncio
import collections
import copy
import functools
import json
import re
import secrets
import string
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml

import admission
import tables
from common import api_error, bad_request, header, parse_namespace_paths
from discovery import RESOURCE_VERBS, Discovery
from objects import (NAMESPACES, SERVER_METADATA, Change, Kind,
                     encode_string_data, guess_kind, has_path, label_namespace, leaf_paths,
                     merge_patch, now, remove_path, spec_part, user_info, version_of)
from openapi import OpenApi

# The audience a TokenReview without `spec.audiences` is checked against, as the API server's own.
API_SERVER_AUDIENCE = 'https://kubernetes.default.svc.cluster.local'

# Changes kept for watches that resume from a resourceVersion. A watch from before them gets a
# 410 Gone (Expired) ERROR event, as from a real API server's watch cache, and the client lists
# again; only the latest version of each object is kept.
LOG_KEPT = 50_000
# Requests GET /__emulator/requests remembers (the newest).
REQUESTS_KEPT = 100_000
# How often a write is prepared again when the object changed while it was being admitted.
WRITE_ATTEMPTS = 5

TOKEN_REVIEWS = kmock.resource('authentication.k8s.io', 'v1', 'tokenreviews')
CRDS = kmock.resource('apiextensions.k8s.io', 'v1', 'customresourcedefinitions')
# Who a request is from when its bearer token is not in the TokenReview table.
ADMIN_USER = {'username': 'kubernetes-admin', 'groups': ['system:masters', 'system:authenticated']}

MERGE_PATCH = 'application/merge-patch+json'
STRATEGIC_MERGE_PATCH = 'application/strategic-merge-patch+json'
JSON_PATCH = 'application/json-patch+json'
APPLY_PATCH = 'application/apply-patch+yaml'

parse_namespace_paths()

@attrs.define(kw_only=True)
class ApiServer(Discovery, OpenApi, kmock.KubernetesEmulator):
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
    # The webhook configurations, the service address table and the admission calls made.
    webhooks: admission.Admission = attrs.field(factory=admission.Admission, init=False)

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
        self['get /__emulator/services'] << (lambda: self.webhooks.services)
        self['post /__emulator/services'] << self.webhooks.update_services
        self['get /__emulator/admissions'] << self.webhooks.calls_log
        self['get /openapi/v3'] << self._serve_openapi_index
        self['get', re.compile(r'/openapi/v3/.+')] << self._serve_openapi_document

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
        warnings = admission.collect_warnings()
        try:
            # Skip the stock emulator's write interceptor: the handlers below change the store.
            response = await kmock.RawHandler._handle(self, request)
        except kmock.KubernetesError as e:
            if not warnings:
                raise
            response = await self._render_error(e)  # a rejection keeps earlier webhooks' warnings
        finally:
            for payload in self._payloads:
                payload._requests.clear()
        if not response.prepared:  # (a watch streams its response before it returns)
            for text in warnings:
                response.headers.add('Warning', admission.warning_header(text))
        return response

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if not isinstance(exc, kmock.KubernetesError):
            traceback.print_exc(file=sys.stderr)
            return await super()._render_error(exc)
        reason = 'NotFound' if isinstance(exc, kmock.KubernetesNotFoundError) else exc.reason
        body = {
            'apiVersion': 'v1', 'kind': 'Status', 'metadata': {}, 'status': 'Failure',
            'message': exc.message, 'code': exc.status,
        }
        if reason:
            body['reason'] = reason
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

    def crd_version(self, resource: kmock.resource) -> dict[str, Any] | None:
        """The served version of the CRD that declares `resource` (`spec.versions[]`), if any."""
        crd = self._current((CRDS, None, f'{resource.plural}.{resource.group}')) if resource.group else None
        for version in ((crd or {}).get('spec') or {}).get('versions') or []:
            if version.get('name') == resource.version and version.get('served', True):
                return version
        return None

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
        if kind.resource in admission.CONFIGURATION_KINDS:
            self.webhooks.configuration_changed(kind.resource, key[2], None if event == 'DELETED' else obj)

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
        if tables.wants_table(request):
            return tables.render(request, self._table_columns(kind), items, str(rv))
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
        if tables.wants_table(request):
            return tables.render(request, self._table_columns(kind), [obj], version_of(obj))
        return self._as_metadata(obj) if self._metadata_only(request) else obj

    def _table_columns(self, kind: Kind) -> list[tables.Column]:
        return tables.columns_for(kind.resource, self.crd_version(kind.resource))

    async def _serve_watch(self, request: kmock.Request) -> Any:
        kind = self._kind_of(request)
        terms = self._selection(request)
        metadata_only = self._metadata_only(request)
        columns = self._table_columns(kind) if tables.wants_table(request) else None
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
            if columns is not None and type_ != 'BOOKMARK':
                return {'type': type_, 'object': tables.render(request, columns, [obj], version_of(obj))}
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
        if 'protobuf' in header(request, 'Content-Type'):
            raise api_error(415, 'UnsupportedMediaType',
                            'the Lifeguard kube emulator does not decode protobuf (kubectl create/run send '
                            'it for built-in kinds): write the object as YAML and use kubectl apply -f')
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
        # As in kube-apiserver, the object exists only after admission (so a webhook is called
        # for a create that then fails with AlreadyExists).
        obj = await self._admit(request, kind, key, self._draft(kind, body, key, named=bool(meta.get('name'))),
                                None, lambda admitted: self._stamp(kind, admitted, key))
        async with self._lock:
            if self._current(key) is not None:
                raise api_error(409, 'AlreadyExists', f'{kind.qualified} "{name}" already exists',
                                **kind.details(name))
            assert obj is not None
            obj['metadata']['resourceVersion'] = str(self._next_rv())
            if not self._dry_run(request):
                await self._record(kind, key, 'ADDED', obj)
        return kmock.Response(status=201, payload=obj)

    def _stamp(self, kind: Kind, body: dict[str, Any], key: tuple[Any, ...]) -> dict[str, Any]:
        """A new object as stored, but for its resourceVersion (given when it is recorded)."""
        obj = encode_string_data(kind, copy.deepcopy(body))
        if kind.status_subresource:
            obj.pop('status', None)
        obj['apiVersion'] = kind.api_version
        obj['kind'] = kind.kind
        meta = obj.get('metadata')
        if not isinstance(meta, dict):
            meta = obj['metadata'] = {}
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
        return label_namespace(kind, obj)

    def _draft(self, kind: Kind, body: dict[str, Any], key: tuple[Any, ...], named: bool) -> dict[str, Any]:
        """A new object as mutating webhooks see it: no uid, generation or creation time yet, and
        no name yet when the client asked for a generated one."""
        obj = self._stamp(kind, body, key)
        for field in ('uid', 'generation', 'creationTimestamp') + (() if named else ('name',)):
            obj['metadata'].pop(field)
        return obj

    def _new_object(self, kind: Kind, body: dict[str, Any], key: tuple[Any, ...]) -> dict[str, Any]:
        obj = self._stamp(kind, body, key)
        obj['metadata']['resourceVersion'] = str(self._next_rv())
        return obj

    @staticmethod
    def _dry_run(request: kmock.Request) -> bool:
        return request.params.get('dryRun') == 'All'

    # --- admission ------------------------------------------------------------------------------

    async def _admit(self, request: kmock.Request, kind: Kind, key: tuple[Any, ...],
                     obj: dict[str, Any] | None, old: dict[str, Any] | None,
                     settle: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any] | None:
        """Runs the admission webhooks on a write (`obj` None: a delete, `old` None: a create);
        returns the object to store. `settle` makes a mutated object storable."""
        attributes = admission.Attributes.of_write(
            request, kind.resource, kind.kind, key[1], obj, old, user=self._user(request),
            delete_options=self._body(request) if obj is None else None)
        return await self.webhooks.admit(attributes, settle, self._namespace_labels)

    def _namespace_labels(self, name: str) -> dict[str, str] | None:
        namespace = self._current((NAMESPACES, None, name))
        return None if namespace is None else dict(namespace['metadata'].get('labels') or {})

    def _user(self, request: kmock.Request) -> dict[str, Any]:
        """Who sent the request: the identity of its bearer token in the TokenReview table, else
        a cluster administrator (the emulator authenticates nobody)."""
        token = header(request, 'Authorization').removeprefix('Bearer ').strip()
        identity = self.tokens.get(token)
        return user_info(identity) if identity is not None else copy.deepcopy(ADMIN_USER)

    @staticmethod
    def _conflict(kind: Kind, name: str) -> kmock.KubernetesError:
        return api_error(409, 'Conflict', f'Operation cannot be fulfilled on {kind.qualified} "{name}": the '
                         'object has been modified; please apply your changes to the latest version and try again',
                         **kind.details(name))

    # --- writing, continued ---------------------------------------------------------------------

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
        for _ in range(WRITE_ATTEMPTS):
            async with self._lock:
                old = self._current(key)
                if old is None and (content_type != APPLY_PATCH or status_only):
                    raise api_error(404, 'NotFound', f'{kind.qualified} "{request.name}" not found',
                                    **kind.details(request.name or ''))
                if old is not None:
                    patched = self._patched(old, body, content_type, key, manager, request.subresource, kind)
            if old is None:  # server-side apply creates what does not exist yet
                new = await self._admit(request, kind, key, self._draft(kind, body, key, named=True), None,
                                        lambda admitted: self._stamp(kind, admitted, key))
            else:
                settle = functools.partial(self._settle, kind, old, status_only=status_only)
                new = await self._admit(request, kind, key, settle(patched), old, settle)
            assert new is not None
            async with self._lock:
                if version_of(self._current(key)) != version_of(old):
                    continue  # changed while admitted: prepare it again
                return await self._commit_update(request, kind, key, old, new, manager, body)
        raise self._conflict(kind, request.name or '')

    def _patched(self, old: dict[str, Any], body: Any, content_type: str, key: tuple[Any, ...],
                 manager: str | None, subresource: str | None, kind: Kind) -> dict[str, Any]:
        if content_type == JSON_PATCH:
            if not isinstance(body, list):
                raise bad_request('a JSON patch must be an array of operations')
            try:
                patched = jsonpatch.apply_patch(old, body, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise api_error(422, 'Invalid', f'the JSON patch does not apply: {e}')
        elif content_type == APPLY_PATCH:
            patched = self._apply(old, key, manager, subresource, body, kind)
        else:
            if not isinstance(body, dict):
                raise bad_request('a merge patch must be an object')
            patched = merge_patch(old, body)
        if not isinstance(patched, dict):
            raise api_error(422, 'Invalid', 'the patch left no object')
        return patched

    async def _commit_update(self, request: kmock.Request, kind: Kind, key: tuple[Any, ...],
                             old: dict[str, Any] | None, new: dict[str, Any], manager: str | None,
                             body: Any) -> Any:
        """Stores an admitted patch (under the lock)."""
        applying = header(request, 'Content-Type').split(';')[0].strip().lower() == APPLY_PATCH
        if old is None:
            new['metadata']['resourceVersion'] = str(self._next_rv())
            if not self._dry_run(request):
                self._remember_applied(key, manager, request.subresource, body, kind)
                await self._record(kind, key, 'ADDED', new)
            return kmock.Response(status=201, payload=new)
        if new == old:  # a no-op: no new resourceVersion, no event
            return kmock.Response(status=200, payload=old)
        meta = new['metadata']
        if spec_part(new) != spec_part(old):
            meta['generation'] = int(old['metadata'].get('generation', 1)) + 1
        meta['resourceVersion'] = str(self._next_rv())
        if self._dry_run(request):
            return kmock.Response(status=200, payload=new)
        if applying:
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
        return label_namespace(kind, new)

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
        for _ in range(WRITE_ATTEMPTS):
            async with self._lock:
                old = self._current(key)
                if old is None:
                    raise api_error(404, 'NotFound', f'{kind.qualified} "{request.name}" not found',
                                    **kind.details(request.name or ''))
                if old['metadata'].get('deletionTimestamp'):
                    return kmock.Response(status=202, payload=old)  # already being deleted
            await self._admit(request, kind, key, None, old, lambda admitted: admitted)
            async with self._lock:
                if version_of(self._current(key)) != version_of(old):
                    continue  # changed while admitted: prepare it again
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
        raise self._conflict(kind, request.name or '')

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
                status = {'authenticated': True, 'user': user_info(identity), 'audiences': wanted}
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
