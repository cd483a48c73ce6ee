"""Admission webhooks for the emulator, called the way kube-apiserver calls them.

The emulator keeps `admissionregistration.k8s.io/v1` MutatingWebhookConfigurations and
ValidatingWebhookConfigurations like any other object; `Admission` mirrors them (the store tells
it of every change) and, for every CREATE, UPDATE and DELETE of any other resource, calls the
webhooks that match:

- mutating webhooks first, configurations in name order and each one's webhooks in their
  order, each with the object as the previous ones left it; a JSONPatch answer is applied at
  once. `reinvocationPolicy: IfNeeded` webhooks are called once more, after the first pass, when
  a webhook after them changed the object (as kube-apiserver does, a single extra round);
- then the store's own changes (`settle`: on CREATE the name, uid and creation time, on
  UPDATE the server-owned fields and the status subresource), the API validation of webhook
  configurations themselves, and the validating webhooks, concurrently, on the final object.

A webhook matches when one of its `rules` does (operations, apiGroups, apiVersions, resources
with `*`, `pods/status`, `*/status`, `pods/*` and `*/*` forms, scope), then its `objectSelector`
matches the new or the old object's labels, then its `namespaceSelector` matches the labels of
the request's namespace (of the object itself for a Namespace; a namespaced request in a
namespace that does not exist is 404, as from kube-apiserver). `matchPolicy` is ignored: rules
match the request's own group and version only. Webhook configurations themselves are never
sent to webhooks.

A call is an `admission.k8s.io/v1` AdmissionReview POSTed to `clientConfig.url` or to the address
a test gave `clientConfig.service` (`POST /__emulator/services`), with `?timeout=Ns` appended as
kube-apiserver does, over HTTPS (HTTP/1.1) verified against `clientConfig.caBundle` (the system
roots without one) and the host of that address. Failures follow kube-apiserver's wording and
`failurePolicy`; every call is recorded for `GET /__emulator/admissions`.
"""

import asyncio
import base64
import binascii
import collections
import contextvars
import copy
import functools
import json
import re
import ssl
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import attrs
import jsonpatch
import kmock

from common import api_error, bad_request

GROUP = 'admissionregistration.k8s.io'
MUTATING = kmock.resource(GROUP, 'v1', 'mutatingwebhookconfigurations')
VALIDATING = kmock.resource(GROUP, 'v1', 'validatingwebhookconfigurations')
CONFIGURATION_KINDS = {MUTATING: 'MutatingWebhookConfiguration', VALIDATING: 'ValidatingWebhookConfiguration'}
NAMESPACES = kmock.resource('', 'v1', 'namespaces')

# Admission calls GET /__emulator/admissions remembers (the newest).
CALLS_KEPT = 10_000
DEFAULT_TIMEOUT_SECONDS = 10
OPERATIONS = ('CREATE', 'UPDATE', 'DELETE', 'CONNECT')
SELECTOR_OPERATORS = ('In', 'NotIn', 'Exists', 'DoesNotExist')

# The warnings the webhooks gave while the current request was admitted, for its `Warning`
# response headers (set by the server for every request it handles).
_warnings: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar('admission_warnings', default=None)


def collect_warnings() -> list[str]:
    """Starts collecting the current request's admission warnings; returns the list they go to."""
    collected: list[str] = []
    _warnings.set(collected)
    return collected


def warning_header(text: str) -> str:
    """`299 - "text"`, as kube-apiserver sends an admission warning (quotes and backslashes escaped)."""
    text = ''.join(' ' if ord(c) < 0x20 or ord(c) == 0x7f else c for c in text)
    return '299 - "' + text.replace('\\', '\\\\').replace('"', '\\"') + '"'


class CallFailed(Exception):
    """The webhook could not be called or gave no usable answer (kube's ErrCallingWebhook)."""


@attrs.frozen
class Attributes:
    """One write as admission sees it (kube-apiserver's `admission.Attributes`)."""
    operation: str  # CREATE, UPDATE or DELETE
    resource: kmock.resource
    subresource: str  # '' for the object itself
    kind: str
    namespace: str  # '' for cluster-scoped objects (Namespaces included)
    name: str  # '' on a CREATE with generateName: the name is chosen after mutating admission
    object: dict[str, Any] | None  # None on DELETE
    old_object: dict[str, Any] | None  # None on CREATE
    dry_run: bool
    options: dict[str, Any]
    user: dict[str, Any]

    @classmethod
    def of_write(cls, request: kmock.Request, resource: kmock.resource, kind: str, namespace: str | None,
                 obj: dict[str, Any] | None, old: dict[str, Any] | None, user: dict[str, Any],
                 delete_options: Any) -> 'Attributes':
        """A write to `resource` (`obj` None: a delete, `old` None: a create) by `user`."""
        operation = 'DELETE' if obj is None else 'CREATE' if old is None else 'UPDATE'
        dry_run = request.params.get('dryRun') == 'All'
        options: dict[str, Any] = {'apiVersion': 'meta.k8s.io/v1', 'kind': f'{operation.title()}Options'}
        if isinstance(delete_options, dict):
            options.update({k: v for k, v in delete_options.items() if k not in ('apiVersion', 'kind')})
        if dry_run:
            options['dryRun'] = ['All']
        if request.params.get('fieldManager') and operation != 'DELETE':
            options['fieldManager'] = request.params['fieldManager']
        name = ((obj or old or {}).get('metadata') or {}).get('name', '')
        return cls(operation=operation, resource=resource, subresource=request.subresource or '', kind=kind,
                   namespace=namespace or '', name=name, object=obj, old_object=old, dry_run=dry_run,
                   options=options, user=user)


@attrs.frozen
class Hook:
    """One webhook of a configuration, with kube-apiserver's defaults for what it leaves out."""
    configuration: str
    webhook: dict[str, Any]
    mutating: bool

    @property
    def name(self) -> str:
        return str(self.webhook.get('name', ''))

    @property
    def timeout(self) -> int:
        return int(self.webhook.get('timeoutSeconds') or DEFAULT_TIMEOUT_SECONDS)

    @property
    def fails_open(self) -> bool:
        return self.webhook.get('failurePolicy') == 'Ignore'

    @property
    def reinvocable(self) -> bool:
        return self.mutating and self.webhook.get('reinvocationPolicy') == 'IfNeeded'


def labels_of(obj: dict[str, Any] | None) -> dict[str, str]:
    return dict((obj or {}).get('metadata', {}).get('labels') or {})


def selector_is_empty(selector: dict[str, Any] | None) -> bool:
    return not selector or not (selector.get('matchLabels') or selector.get('matchExpressions'))


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: every matchLabels pair and every matchExpressions term hold."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get('matchLabels') or {}).items()):
        return False
    for term in selector.get('matchExpressions') or []:
        key, operator, values = term.get('key'), term.get('operator'), term.get('values') or []
        present = key in labels
        holds = {
            'In': present and labels.get(key) in values,
            'NotIn': not present or labels.get(key) not in values,
            'Exists': present,
            'DoesNotExist': not present,
        }.get(operator, False)
        if not holds:
            return False
    return True


def rule_matches(rule: dict[str, Any], a: Attributes) -> bool:
    """kube-apiserver's rules.Matcher: operation, group, version, resource[/subresource], scope."""
    operations = rule.get('operations') or []
    if '*' not in operations and a.operation not in operations:
        return False
    group, version = a.resource.group or '', a.resource.version or ''
    if not any(g in ('*', group) for g in rule.get('apiGroups') or []):
        return False
    if not any(v in ('*', version) for v in rule.get('apiVersions') or []):
        return False
    for listed in rule.get('resources') or []:
        resource, _, subresource = listed.partition('/')
        if resource in ('*', a.resource.plural) and subresource in ('*', a.subresource):
            break
    else:
        return False
    is_namespace = a.resource == NAMESPACES
    match rule.get('scope') or '*':
        case 'Namespaced':
            return not is_namespace and a.namespace != ''
        case 'Cluster':
            return is_namespace or a.namespace == ''
    return True


@attrs.define
class Admission:
    """The webhook configurations, the service address table and the record of calls."""

    # `namespace/name:port` -> `https://host:port`, where `clientConfig.service` is reached.
    services: dict[str, str] = attrs.field(factory=dict)
    calls: collections.deque[dict[str, Any]] = attrs.field(
        factory=lambda: collections.deque(maxlen=CALLS_KEPT))
    # resource -> configuration name -> the stored configuration.
    _configurations: dict[kmock.resource, dict[str, dict[str, Any]]] = attrs.field(
        factory=lambda: {MUTATING: {}, VALIDATING: {}})

    # --- the configurations and the test-only endpoints -----------------------------------------

    def configuration_changed(self, resource: kmock.resource, name: str, obj: dict[str, Any] | None) -> None:
        """The store's hook: a webhook configuration was written (or deleted: `obj` None)."""
        if obj is None:
            self._configurations[resource].pop(name, None)
        else:
            self._configurations[resource][name] = copy.deepcopy(obj)

    def hooks(self, resource: kmock.resource) -> list[Hook]:
        configurations = self._configurations[resource]
        return [Hook(configuration=name, webhook=webhook, mutating=resource == MUTATING)
                for name in sorted(configurations)
                for webhook in configurations[name].get('webhooks') or []]

    def update_services(self, request: kmock.Request) -> Any:
        """`POST /__emulator/services` `{"ns/name:port": "https://127.0.0.1:PORT" | null}`."""
        changes = request.data
        if not isinstance(changes, dict):
            raise bad_request('expected a JSON object {"namespace/name:port": "https://host:port" or null}')
        for key, address in changes.items():
            match = re.fullmatch(r'([^/:\s]+)/([^/:\s]+)(?::(\d+))?', key)
            if match is None:
                raise bad_request(f'a service is named "namespace/name:port", not {key!r}')
            key = f'{match[1]}/{match[2]}:{match[3] or 443}'
            if address is None:
                self.services.pop(key, None)
                continue
            url = urllib.parse.urlsplit(address) if isinstance(address, str) else None
            if url is None or url.scheme != 'https' or not url.hostname or url.path not in ('', '/') \
                    or url.query or url.fragment:
                raise bad_request(f'the address of {key} must be "https://host:port", not {address!r}')
            self.services[key] = address.rstrip('/')
        return self.services

    def calls_log(self) -> Any:
        return list(self.calls)

    # --- admitting a write ----------------------------------------------------------------------

    async def admit(self, a: Attributes, settle: Callable[[dict[str, Any]], dict[str, Any]],
                    namespace_labels: Callable[[str], dict[str, str] | None]) -> dict[str, Any] | None:
        """The object to store after admission (None on DELETE); raises the API error that rejects
        the write."""
        exempt = (a.resource.group or '') == GROUP  # kube-apiserver never sends these to webhooks
        obj = a.object
        if not exempt:
            obj = await self._mutate(a, namespace_labels)
        if obj is not None:
            obj = settle(obj)
            if a.resource in CONFIGURATION_KINDS and not a.subresource:
                check_configuration(a.resource, obj)
        if not exempt:
            await self._validate(attrs.evolve(a, object=obj), namespace_labels)
        return obj

    def _matches(self, hook: Hook, a: Attributes, namespace_labels: Callable[[str], dict[str, str] | None]) -> bool:
        webhook = hook.webhook
        if not any(rule_matches(rule, a) for rule in webhook.get('rules') or []):
            return False
        selector = webhook.get('objectSelector')
        if not selector_is_empty(selector) and not any(
                o is not None and selects(selector, labels_of(o)) for o in (a.object, a.old_object)):
            return False
        selector = webhook.get('namespaceSelector')
        is_namespace = a.resource == NAMESPACES
        if selector_is_empty(selector) or (a.namespace == '' and not is_namespace):
            return True
        if is_namespace and not a.subresource and a.operation in ('CREATE', 'UPDATE'):
            labels = labels_of(a.object)
        else:
            namespace = a.name if is_namespace else a.namespace
            found = namespace_labels(namespace)
            if found is None:
                raise api_error(404, 'NotFound', f'namespaces "{namespace}" not found',
                                name=namespace, kind='namespaces')
            labels = found
        return selects(selector, labels)

    async def _mutate(self, a: Attributes, namespace_labels: Callable[[str], dict[str, str] | None]) -> dict[str, Any] | None:
        hooks = self.hooks(MUTATING)
        obj = a.object
        invoked: set[int] = set()  # IfNeeded webhooks called since the object last changed
        again: set[int] = set()  # IfNeeded webhooks a later change makes call once more
        for round_ in (0, 1):
            for index, hook in enumerate(hooks):
                if round_ == 1 and index not in again:
                    continue
                current = attrs.evolve(a, object=obj)
                if not self._matches(hook, current, namespace_labels):
                    continue
                patched = await self._call(hook, current, round_)
                if round_ == 0 and patched != obj:
                    again |= invoked
                    invoked = set()
                if round_ == 0 and hook.reinvocable:
                    invoked.add(index)
                obj = patched
            if not again:
                break
        return obj

    async def _validate(self, a: Attributes, namespace_labels: Callable[[str], dict[str, str] | None]) -> None:
        hooks = [hook for hook in self.hooks(VALIDATING) if self._matches(hook, a, namespace_labels)]
        # Concurrently, as kube-apiserver does; the first rejection in webhook order wins.
        results = await asyncio.gather(*(self._call(hook, a, 0) for hook in hooks), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _call(self, hook: Hook, a: Attributes, round_: int) -> dict[str, Any] | None:
        """Calls one webhook: the object as it patched it (mutating), or the object unchanged;
        raises the API error of a rejection or of a failed call under `failurePolicy: Fail`."""
        uid = str(uuid.uuid4())
        record: dict[str, Any] = {
            'webhook': hook.name, 'configuration': hook.configuration,
            'type': 'mutating' if hook.mutating else 'validating', 'round': round_, 'uid': uid,
            'operation': a.operation,
            'resource': {'group': a.resource.group or '', 'version': a.resource.version or '',
                         'resource': a.resource.plural or ''},
            'subResource': a.subresource, 'namespace': a.namespace, 'name': a.name,
            'dryRun': a.dry_run, 'url': None, 'allowed': None, 'patched': False, 'patch': None,
            'warnings': [], 'status': None, 'error': None, 'ignored': False,
        }
        self.calls.append(record)  # before the first await: records keep the calling order
        try:
            url = self._url(hook)
            record['url'] = url
            answer = await self._post(hook, url, review(uid, a))
            result = check_answer(answer, uid, hook.mutating)
        except CallFailed as e:
            record['error'] = f'failed calling webhook "{hook.name}": {e}'
            if hook.fails_open:
                record['ignored'] = True
                return a.object
            raise api_error(500, 'InternalError', f'Internal error occurred: {record["error"]}')
        warnings = [w for w in result.get('warnings') or [] if isinstance(w, str)]
        record['warnings'] = warnings
        collected = _warnings.get()
        if collected is not None:
            collected.extend(w for w in warnings if w not in collected)
        record['allowed'] = result.get('allowed') is True
        if result.get('allowed') is not True:
            error = denial(hook.name, result.get('status'))
            record['status'] = {'code': error.status, 'reason': error.reason, 'message': error.message}
            raise error
        patch = decode_patch(result.get('patch'))
        if not patch:
            return a.object
        if a.object is None:
            raise api_error(500, 'InternalError',
                            f'Internal error occurred: admission webhook "{hook.name}" attempted to modify '
                            'the object, which is not supported for this operation')
        try:
            patched = jsonpatch.apply_patch(a.object, patch, in_place=False)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            raise api_error(500, 'InternalError', f'Internal error occurred: {e}')
        if not isinstance(patched, dict):
            raise api_error(500, 'InternalError', 'Internal error occurred: the patch left no object')
        record['patched'], record['patch'] = True, patch
        return patched

    def _url(self, hook: Hook) -> str:
        config = hook.webhook.get('clientConfig') or {}
        if config.get('url'):
            return str(config['url'])
        service = config.get('service') or {}
        port = service.get('port') or 443
        path = service.get('path') or ''
        key = f'{service.get("namespace")}/{service.get("name")}:{port}'
        address = self.services.get(key)
        if address is None:
            raise CallFailed(
                f'failed to call webhook: Post "https://{service.get("name")}.{service.get("namespace")}.svc:'
                f'{port}{path}?timeout={hook.timeout}s": no address for service {key} in the emulator '
                f'(POST /__emulator/services {{"{key}": "https://127.0.0.1:PORT"}})')
        return address + path

    async def _post(self, hook: Hook, url: str, body: dict[str, Any]) -> Any:
        target = f'{url}{"&" if "?" in url else "?"}timeout={hook.timeout}s'
        try:
            tls = tls_context((hook.webhook.get('clientConfig') or {}).get('caBundle') or '')
        except (ValueError, ssl.SSLError) as e:
            raise CallFailed(f'could not get REST client: unable to load root certificates: {e}')
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=hook.timeout)) as session:
                async with session.post(target, data=json.dumps(body), ssl=tls, headers={
                        'Content-Type': 'application/json', 'Accept': 'application/json'}) as response:
                    status, content = response.status, await response.read()
        except TimeoutError:
            raise CallFailed(f'failed to call webhook: Post "{target}": context deadline exceeded')
        except (aiohttp.ClientError, OSError) as e:
            raise CallFailed(f'failed to call webhook: Post "{target}": {e}')
        if not 200 <= status < 300:
            raise CallFailed(f'failed to call webhook: the server responded with HTTP {status}: '
                             f'{content[:512].decode(errors="replace")}')
        try:
            return json.loads(content)
        except ValueError as e:
            raise CallFailed(f'received invalid webhook response: {e}')


@functools.lru_cache(maxsize=64)
def tls_context(ca_bundle: str) -> ssl.SSLContext:
    """Verifies the webhook's certificate chain against the base64 PEM `caBundle` (the system
    roots without one) and its name against the host dialled."""
    if not ca_bundle:
        return ssl.create_default_context()
    try:
        pem = base64.b64decode(ca_bundle, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as e:
        raise ValueError(f'caBundle is not base64 of PEM: {e}')
    return ssl.create_default_context(cadata=pem)


def review(uid: str, a: Attributes) -> dict[str, Any]:
    """The `admission.k8s.io/v1` AdmissionReview kube-apiserver sends for `a`."""
    group, version = a.resource.group or '', a.resource.version or ''
    kind = {'group': group, 'version': version, 'kind': a.kind}
    resource = {'group': group, 'version': version, 'resource': a.resource.plural or ''}
    request: dict[str, Any] = {
        'uid': uid, 'kind': kind, 'resource': resource, 'requestKind': kind, 'requestResource': resource,
        'operation': a.operation, 'userInfo': a.user,
        'object': a.object, 'oldObject': a.old_object, 'dryRun': a.dry_run, 'options': a.options,
    }
    if a.subresource:
        request['subResource'] = request['requestSubResource'] = a.subresource
    if a.name:
        request['name'] = a.name
    if a.namespace:
        request['namespace'] = a.namespace
    return {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview', 'request': request}


def check_answer(answer: Any, uid: str, mutating: bool) -> dict[str, Any]:
    """The `response` of a webhook's AdmissionReview, checked as kube-apiserver checks it."""
    def invalid(why: str) -> CallFailed:
        return CallFailed(f'received invalid webhook response: {why}')
    if not isinstance(answer, dict) or not isinstance(answer.get('response'), dict):
        raise invalid('webhook response was absent')
    response = answer['response']
    if response.get('uid') != uid:
        raise invalid(f'expected response.uid="{uid}", got "{response.get("uid", "")}"')
    got = f'{answer.get("apiVersion", "")}, Kind={answer.get("kind", "")}'
    if got != 'admission.k8s.io/v1, Kind=AdmissionReview':
        raise invalid(f'expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {got}')
    patch_type = response.get('patchType') or ''
    if mutating:
        if response.get('patch') and not patch_type:
            raise invalid('webhook returned response.patch but not response.patchType')
        if patch_type and patch_type != 'JSONPatch':
            raise invalid(f'webhook returned invalid response.patchType of "{patch_type}"')
    elif response.get('patch') or patch_type:
        raise invalid('validating webhook may not return response.patch or response.patchType')
    return response


def decode_patch(patch: Any) -> list[Any]:
    """A response's base64 JSONPatch, as a list of operations."""
    if not patch:
        return []
    try:
        operations = json.loads(base64.b64decode(patch, validate=True))
    except (binascii.Error, ValueError, TypeError) as e:
        raise api_error(500, 'InternalError', f'Internal error occurred: the patch is not base64 JSON: {e}')
    if not isinstance(operations, list):
        raise api_error(500, 'InternalError', 'Internal error occurred: the patch is not a JSON array')
    return operations


def denial(webhook: str, status: Any) -> kmock.KubernetesError:
    """kube-apiserver's rejection: the webhook's status, at least 400, its message prefixed."""
    status = status if isinstance(status, dict) else {}
    code = status.get('code') if isinstance(status.get('code'), int) and status['code'] >= 400 else 400
    denied = f'admission webhook "{webhook}" denied the request'
    if status.get('message'):
        message = f'{denied}: {status["message"]}'
    elif status.get('reason'):
        message = f'{denied}: {status["reason"]}'
    else:
        message = f'{denied} without explanation'
    return kmock.KubernetesError(status=code, reason=status.get('reason') or '', message=message,
                                 details=status.get('details') or None)


def check_configuration(resource: kmock.resource, obj: dict[str, Any]) -> None:
    """The API validation kube-apiserver gives a webhook configuration (the parts a test can trip
    over), as a 422 Invalid listing every problem."""
    problems: list[str] = []
    names: set[str] = set()
    webhooks = obj.get('webhooks') or []
    if not isinstance(webhooks, list):
        webhooks, problems = [], ['webhooks: Invalid value: must be a list']
    for i, webhook in enumerate(webhooks):
        at = f'webhooks[{i}]'
        if not isinstance(webhook, dict):
            problems.append(f'{at}: Invalid value: must be an object')
            continue
        name = webhook.get('name') or ''
        if not name:
            problems.append(f'{at}.name: Required value')
        elif name.count('.') < 2:
            problems.append(f'{at}.name: Invalid value: "{name}": should be a domain with at least three segments separated by dots')
        elif name in names:
            problems.append(f'{at}.name: Duplicate value: "{name}"')
        names.add(name)
        problems.extend(client_config_problems(f'{at}.clientConfig', webhook.get('clientConfig')))
        if 'v1' not in (webhook.get('admissionReviewVersions') or []):
            problems.append(f'{at}.admissionReviewVersions: Required value: must include v1 '
                            '(the only AdmissionReview version the emulator sends)')
        if webhook.get('sideEffects') not in ('None', 'NoneOnDryRun'):
            problems.append(f'{at}.sideEffects: Unsupported value: {json.dumps(webhook.get("sideEffects"))}: '
                            'supported values: "None", "NoneOnDryRun"')
        for field, allowed in (('failurePolicy', ('Fail', 'Ignore')), ('matchPolicy', ('Exact', 'Equivalent')),
                               ('reinvocationPolicy', ('Never', 'IfNeeded') if resource == MUTATING else ())):
            if field in webhook and webhook[field] not in allowed:
                problems.append(f'{at}.{field}: Unsupported value: {json.dumps(webhook[field])}')
        timeout = webhook.get('timeoutSeconds', DEFAULT_TIMEOUT_SECONDS)
        if not isinstance(timeout, int) or not 1 <= timeout <= 30:
            problems.append(f'{at}.timeoutSeconds: Invalid value: {json.dumps(timeout)}: the timeout value must be between 1 and 30 seconds')
        for j, rule in enumerate(webhook.get('rules') or []):
            problems.extend(rule_problems(f'{at}.rules[{j}]', rule))
        for field in ('namespaceSelector', 'objectSelector'):
            problems.extend(selector_problems(f'{at}.{field}', webhook.get(field)))
        if webhook.get('matchConditions'):
            problems.append(f'{at}.matchConditions: Forbidden: the Lifeguard kube emulator does not evaluate '
                            'matchConditions (CEL); see tests/kube_emulator/README.md')
    if problems:
        name = (obj.get('metadata') or {}).get('name', '')
        listed = problems[0] if len(problems) == 1 else '[' + ', '.join(problems) + ']'
        raise api_error(422, 'Invalid', f'{CONFIGURATION_KINDS[resource]}.{GROUP} "{name}" is invalid: {listed}',
                        name=name, group=GROUP, kind=CONFIGURATION_KINDS[resource])


def client_config_problems(at: str, config: Any) -> list[str]:
    if not isinstance(config, dict) or bool(config.get('url')) == bool(config.get('service')):
        return [f'{at}: Required value: exactly one of url or service is required']
    problems = []
    if config.get('url'):
        url = urllib.parse.urlsplit(str(config['url']))
        if url.scheme != 'https':
            problems.append(f'{at}.url: Invalid value: "{config["url"]}": \'https\' is the only allowed URL scheme')
        if url.query or url.fragment or url.username:
            problems.append(f'{at}.url: Invalid value: "{config["url"]}": query, fragment and user info are not allowed')
    else:
        service = config['service']
        for field in ('namespace', 'name'):
            if not service.get(field):
                problems.append(f'{at}.service.{field}: Required value: service {field} is required')
        port = service.get('port', 443)
        if not isinstance(port, int) or not 1 <= port <= 65535:
            problems.append(f'{at}.service.port: Invalid value: {json.dumps(port)}')
        if service.get('path') and not str(service['path']).startswith('/'):
            problems.append(f'{at}.service.path: Invalid value: "{service["path"]}": must start with a \'/\'')
    if config.get('caBundle'):
        try:
            base64.b64decode(config['caBundle'], validate=True)
        except (binascii.Error, ValueError):
            problems.append(f'{at}.caBundle: Invalid value: not base64')
    return problems


def rule_problems(at: str, rule: Any) -> list[str]:
    if not isinstance(rule, dict):
        return [f'{at}: Invalid value: must be an object']
    problems = []
    for field in ('operations', 'apiGroups', 'apiVersions', 'resources'):
        if not rule.get(field):
            problems.append(f'{at}.{field}: Required value')
        elif not isinstance(rule[field], list) or not all(isinstance(v, str) for v in rule[field]):
            problems.append(f'{at}.{field}: Invalid value: must be a list of strings')
    if problems:
        return problems
    operations = rule.get('operations') or []
    if any(op not in OPERATIONS + ('*',) for op in operations) or ('*' in operations and len(operations) > 1):
        problems.append(f'{at}.operations: Unsupported value: {json.dumps(operations)}')
    if rule.get('scope', '*') not in ('*', 'Cluster', 'Namespaced'):
        problems.append(f'{at}.scope: Unsupported value: {json.dumps(rule["scope"])}')
    return problems


def selector_problems(at: str, selector: Any) -> list[str]:
    if selector is None:
        return []
    if not isinstance(selector, dict):
        return [f'{at}: Invalid value: must be a label selector']
    labels, terms = selector.get('matchLabels') or {}, selector.get('matchExpressions') or []
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        return [f'{at}.matchLabels: Invalid value: must map label keys to strings']
    if not isinstance(terms, list) or not all(isinstance(term, dict) for term in terms):
        return [f'{at}.matchExpressions: Invalid value: must be a list of requirements']
    problems = []
    for i, term in enumerate(terms):
        operator, values = term.get('operator'), term.get('values')
        if operator not in SELECTOR_OPERATORS:
            problems.append(f'{at}.matchExpressions[{i}].operator: Invalid value: {json.dumps(operator)}: '
                            'not a valid selector operator')
        elif operator in ('In', 'NotIn') and not values:
            problems.append(f'{at}.matchExpressions[{i}].values: Required value: must be specified when '
                            '`operator` is \'In\' or \'NotIn\'')
        elif operator in ('Exists', 'DoesNotExist') and values:
            problems.append(f'{at}.matchExpressions[{i}].values: Forbidden: may not be specified when '
                            '`operator` is \'Exists\' or \'DoesNotExist\'')
    return problems
