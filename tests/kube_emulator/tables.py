"""Server-side printing: `meta.k8s.io/v1` Tables, which `kubectl get` asks for
(`Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...`) and prints as columns.

As kube-apiserver renders them:

- a custom resource: `Name`, then the served version's `additionalPrinterColumns` (or `Age`
  when it has none), with their `type`, `format`, `description` and `priority` (kubectl shows a
  column of priority > 0 only with `-o wide`). Cells come from the column's JSONPath (the subset
  CRDs use: `.a.b`, `['a']`, `[0]`, `[*]`, `[?(@.f=="v")]`); a `date` is rendered as an age
  (`5m`, as kube-apiserver renders it), an `integer`, `number` or `boolean` as a JSON value, a
  `string` as the JSONPath prints it; a missing value is `null` (kubectl prints nothing);
- Pods: `NAME READY STATUS RESTARTS AGE`, wide `IP NODE NOMINATED NODE READINESS GATES`, from
  the status as kube-apiserver's printer reads it (native sidecars, init containers with
  `restartPolicy: Always`, count toward READY; STATUS is the phase or the reason a container
  gives). A Pod without `status.phase` shows `Pending`, as a real API server creates it;
- Deployments: `NAME READY UP-TO-DATE AVAILABLE AGE`, wide `CONTAINERS IMAGES SELECTOR`
  (`spec.replicas` counts as 1 when absent, its default);
- Namespaces: `NAME STATUS AGE` (`Active` when `status.phase` is absent, as it is defaulted);
- CustomResourceDefinitions: `NAME CREATED AT`, as kube-apiserver's default table;
- anything else: `NAME AGE` (kube-apiserver has kind-specific columns for most built-ins).

Each row carries its object as `PartialObjectMetadata` (`includeObject=Object`: the whole
object, `None`: none), which kubectl reads for `--show-labels` and the NAMESPACE column.
"""

import datetime
import json
import re
from collections.abc import Callable
from typing import Any

import kmock

from common import header

CRDS = kmock.resource('apiextensions.k8s.io', 'v1', 'customresourcedefinitions')

# Descriptions of the common columns, as kube-apiserver words them (abridged).
NAME_DESCRIPTION = ('Name must be unique within a namespace. Is required when creating resources, '
                    'although some resources may allow a client to request the generation of an '
                    'appropriate name automatically.')
AGE_DESCRIPTION = ('CreationTimestamp is a timestamp representing the server time when this object '
                   'was created.')

Cell = Any
Column = tuple[dict[str, Any], Callable[[dict[str, Any]], Cell]]


def wants_table(request: kmock.Request) -> bool:
    """True when the client accepts a `meta.k8s.io/v1` Table (kubectl get, human-readable)."""
    for media in header(request, 'Accept').split(','):
        params = {k.strip(): v.strip() for k, _, v in (p.partition('=') for p in media.split(';')[1:])}
        if params.get('as') == 'Table' and params.get('g') == 'meta.k8s.io' and params.get('v') == 'v1':
            return True
    return False


# --- values -------------------------------------------------------------------------------------

def parse_time(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace('Z', '+00:00'))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def human_duration(seconds: float) -> str:
    """An age as kubectl prints it: `45s`, `3m20s`, `25m`, `5h10m`, `3d4h`, `40d`, `2y30d`."""
    s = int(seconds)
    if s < -1:
        return '<invalid>'
    if s < 0:
        return '0s'
    if s < 120:
        return f'{s}s'
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if minutes < 10:
        return f'{minutes}m{s % 60}s' if s % 60 else f'{minutes}m'
    if minutes < 180:
        return f'{minutes}m'
    if hours < 8:
        return f'{hours}h{minutes % 60}m' if minutes % 60 else f'{hours}h'
    if hours < 48:
        return f'{hours}h'
    if hours < 24 * 8:
        return f'{days}d{hours % 24}h' if hours % 24 else f'{days}d'
    if hours < 24 * 365 * 2:
        return f'{days}d'
    if hours < 24 * 365 * 8:
        return f'{days // 365}y{days % 365}d' if days % 365 else f'{days // 365}y'
    return f'{days // 365}y'


def age(value: Any) -> str:
    """The age of an RFC 3339 timestamp (`<unknown>` without one, `<invalid>` for garbage)."""
    if value in (None, ''):
        return '<unknown>'
    when = parse_time(value)
    if when is None:
        return '<invalid>'
    return human_duration((datetime.datetime.now(datetime.UTC) - when).total_seconds())


def jsonpath_text(value: Any) -> str:
    """A value as a Kubernetes JSONPath template prints it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(',', ':'))
    return str(value)


# --- JSONPath (the subset printer columns use) ----------------------------------------------------

_STEP = re.compile(r"""
    \.(?P<field>[A-Za-z0-9_\-$]+)
  | \[\s*'(?P<quoted>[^']*)'\s*\]
  | \[\s*"(?P<dquoted>[^"]*)"\s*\]
  | \[\s*(?P<index>-?\d+)\s*\]
  | \[\s*(?P<star>\*)\s*\]
  | \[\s*\?\(\s*@\.(?P<key>[A-Za-z0-9_.\-]+)\s*(?P<op>==|!=)\s*(?:"(?P<dv>[^"]*)"|'(?P<sv>[^']*)'|(?P<nv>[^)\s]+))\s*\)\s*\]
""", re.VERBOSE)


def compile_jsonpath(path: str) -> list[tuple[str, Any]]:
    """`.status.conditions[?(@.type=="Ready")].status` as steps; ValueError outside the subset."""
    text = path.strip()
    if text.startswith('{') and text.endswith('}'):
        text = text[1:-1].strip()
    text = text.removeprefix('$')
    steps: list[tuple[str, Any]] = []
    position = 0
    while position < len(text):
        match = _STEP.match(text, position)
        if match is None:
            raise ValueError(f'unsupported JSONPath {path!r} at {text[position:]!r}')
        if match['field'] is not None:
            steps.append(('field', match['field']))
        elif match['quoted'] is not None or match['dquoted'] is not None:
            steps.append(('field', match['quoted'] if match['quoted'] is not None else match['dquoted']))
        elif match['index'] is not None:
            steps.append(('index', int(match['index'])))
        elif match['star'] is not None:
            steps.append(('all', None))
        else:
            wanted = match['dv'] if match['dv'] is not None else match['sv'] if match['sv'] is not None else match['nv']
            steps.append(('filter', (match['key'].split('.'), match['op'], wanted)))
        position = match.end()
    return steps


def _matches(item: Any, key: list[str], op: str, wanted: str) -> bool:
    value = item
    for part in key:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    equal = jsonpath_text(value) == wanted
    return equal if op == '==' else not equal


def evaluate(steps: list[tuple[str, Any]], obj: Any) -> list[Any]:
    """Every value the path reaches, in order."""
    current = [obj]
    for step, arg in steps:
        reached: list[Any] = []
        for value in current:
            if step == 'field' and isinstance(value, dict) and arg in value:
                reached.append(value[arg])
            elif step == 'index' and isinstance(value, list) and -len(value) <= arg < len(value):
                reached.append(value[arg])
            elif step == 'all' and isinstance(value, list):
                reached.extend(value)
            elif step == 'all' and isinstance(value, dict):
                reached.extend(value.values())
            elif step == 'filter' and isinstance(value, list):
                reached.extend(item for item in value if _matches(item, *arg))
        current = reached
    return current


def typed_cell(type_: str, value: Any) -> Cell:
    """A printer column's cell from the first value its JSONPath reached."""
    if value is None:
        return None
    if type_ == 'string':
        return jsonpath_text(value)
    if type_ == 'integer' and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if type_ == 'number' and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if type_ == 'boolean' and isinstance(value, bool):
        return value
    if type_ == 'date' and isinstance(value, str):
        return age(value)
    return None


# --- columns ------------------------------------------------------------------------------------

def column(name: str, cell: Callable[[dict[str, Any]], Cell], type_: str = 'string',
           description: str = '', priority: int = 0, format_: str = '') -> Column:
    definition = {'name': name, 'type': type_, 'format': format_, 'description': description,
                  'priority': priority}
    return definition, cell


NAME = column('Name', lambda o: o['metadata'].get('name', ''), format_='name', description=NAME_DESCRIPTION)
AGE = column('Age', lambda o: age(o['metadata'].get('creationTimestamp')), description=AGE_DESCRIPTION)


def crd_columns(version: dict[str, Any]) -> list[Column]:
    """Name and the version's additionalPrinterColumns (Age when there are none)."""
    declared = version.get('additionalPrinterColumns') or [
        {'name': 'Age', 'type': 'date', 'jsonPath': '.metadata.creationTimestamp', 'description': AGE_DESCRIPTION}]
    columns = [NAME]
    for declared_column in declared:
        path = declared_column.get('jsonPath', '')
        type_ = declared_column.get('type', 'string')
        try:
            steps = compile_jsonpath(path)
        except ValueError:
            steps = None

        def cell(obj: dict[str, Any], steps: Any = steps, type_: str = type_) -> Cell:
            found = evaluate(steps, obj) if steps is not None else []
            return typed_cell(type_, found[0]) if found else None

        columns.append(column(
            declared_column.get('name', ''), cell, type_,
            declared_column.get('description') or f'Custom resource definition column (in JSONPath format): {path}',
            int(declared_column.get('priority') or 0), declared_column.get('format') or ''))
    return columns


def _started(status: dict[str, Any]) -> bool:
    return status.get('started') is True


def _exit_reason(terminated: dict[str, Any]) -> str:
    if terminated.get('reason'):
        return terminated['reason']
    if terminated.get('signal'):
        return f'Signal:{terminated["signal"]}'
    return f'ExitCode:{terminated.get("exitCode", 0)}'


def _condition_true(status: dict[str, Any], type_: str) -> bool:
    return any(c.get('type') == type_ and c.get('status') == 'True' for c in status.get('conditions') or [])


def pod_summary(pod: dict[str, Any]) -> tuple[str, str, str]:
    """READY, STATUS and RESTARTS of a Pod, as kube-apiserver's printer derives them."""
    spec, status = pod.get('spec') or {}, pod.get('status') or {}
    init_specs = {c.get('name'): c for c in spec.get('initContainers') or []}
    sidecars = {name for name, c in init_specs.items() if c.get('restartPolicy') == 'Always'}
    total = len(spec.get('containers') or []) + len(sidecars)
    ready = 0
    phase = status.get('phase') or 'Pending'
    reason = status.get('reason') or phase
    if any(c.get('type') == 'PodScheduled' and c.get('reason') == 'SchedulingGated'
           for c in status.get('conditions') or []):
        reason = 'SchedulingGated'
    restarts = sidecar_restarts = 0
    last_restart: datetime.datetime | None = None
    last_sidecar_restart: datetime.datetime | None = None

    def later(current: datetime.datetime | None, state: dict[str, Any]) -> datetime.datetime | None:
        finished = parse_time(((state.get('lastState') or {}).get('terminated') or {}).get('finishedAt'))
        return finished if finished and (current is None or finished > current) else current

    initializing = False
    init_statuses = status.get('initContainerStatuses') or []
    for index, container in enumerate(init_statuses):
        state = container.get('state') or {}
        restarts += int(container.get('restartCount') or 0)
        last_restart = later(last_restart, container)
        is_sidecar = container.get('name') in sidecars
        if is_sidecar:
            sidecar_restarts += int(container.get('restartCount') or 0)
            last_sidecar_restart = later(last_sidecar_restart, container)
        terminated, waiting = state.get('terminated'), state.get('waiting')
        if terminated is not None and int(terminated.get('exitCode') or 0) == 0:
            continue
        if is_sidecar and _started(container):
            ready += 1 if container.get('ready') else 0
            continue
        if terminated is not None:
            reason = f'Init:{_exit_reason(terminated)}'
        elif waiting is not None and waiting.get('reason') and waiting['reason'] != 'PodInitializing':
            reason = f'Init:{waiting["reason"]}'
        else:
            reason = f'Init:{index}/{len(init_specs)}'
        initializing = True
        break

    if not initializing or _condition_true(status, 'Initialized'):
        restarts, last_restart = sidecar_restarts, last_sidecar_restart
        running = False
        for container in reversed(status.get('containerStatuses') or []):
            state = container.get('state') or {}
            restarts += int(container.get('restartCount') or 0)
            last_restart = later(last_restart, container)
            terminated, waiting = state.get('terminated'), state.get('waiting')
            if waiting is not None and waiting.get('reason'):
                reason = waiting['reason']
            elif terminated is not None:
                reason = _exit_reason(terminated)
            elif container.get('ready') and state.get('running') is not None:
                running = True
                ready += 1
        if reason == 'Completed' and running:
            reason = 'Running' if _condition_true(status, 'Ready') else 'NotReady'

    if pod['metadata'].get('deletionTimestamp'):
        if status.get('reason') == 'NodeLost':
            reason = 'Unknown'
        elif phase not in ('Succeeded', 'Failed'):
            reason = 'Terminating'
    restart_text = str(restarts)
    if restarts and last_restart is not None:
        ago = human_duration((datetime.datetime.now(datetime.UTC) - last_restart).total_seconds())
        restart_text = f'{restarts} ({ago} ago)'
    return f'{ready}/{total}', reason, restart_text


def _readiness_gates(pod: dict[str, Any]) -> str:
    gates = (pod.get('spec') or {}).get('readinessGates') or []
    if not gates:
        return '<none>'
    status = pod.get('status') or {}
    met = sum(1 for gate in gates if _condition_true(status, gate.get('conditionType', '')))
    return f'{met}/{len(gates)}'


def _pod_ip(pod: dict[str, Any]) -> str:
    status = pod.get('status') or {}
    ips = status.get('podIPs') or []
    return (ips[0].get('ip') if ips else None) or status.get('podIP') or '<none>'


POD_COLUMNS = [
    NAME,
    column('Ready', lambda p: pod_summary(p)[0],
           description='The aggregate readiness state of this pod for accepting traffic.'),
    column('Status', lambda p: pod_summary(p)[1], description='The aggregate status of the containers in this pod.'),
    column('Restarts', lambda p: pod_summary(p)[2],
           description='The number of times the containers in this pod have been restarted and when the last '
                       'container in this pod has restarted.'),
    AGE,
    column('IP', _pod_ip, priority=1, description='IP address allocated to the pod.'),
    column('Node', lambda p: (p.get('spec') or {}).get('nodeName') or '<none>', priority=1,
           description='The node the pod is scheduled onto.'),
    column('Nominated Node', lambda p: (p.get('status') or {}).get('nominatedNodeName') or '<none>', priority=1,
           description='The node the scheduler nominated for preemption.'),
    column('Readiness Gates', _readiness_gates, priority=1, description='Pod readiness gates met.'),
]


def label_selector_text(selector: dict[str, Any] | None) -> str:
    """A LabelSelector as kubectl writes it: `app=x,tier in (a,b),!gone`."""
    if not selector:
        return '<none>'
    terms = [f'{k}={v}' for k, v in sorted((selector.get('matchLabels') or {}).items())]
    for expression in selector.get('matchExpressions') or []:
        key, operator = expression.get('key', ''), expression.get('operator', '')
        values = expression.get('values') or []
        if operator == 'In':
            terms.append(f'{key} in ({",".join(values)})')
        elif operator == 'NotIn':
            terms.append(f'{key} notin ({",".join(values)})')
        elif operator == 'Exists':
            terms.append(key)
        elif operator == 'DoesNotExist':
            terms.append(f'!{key}')
    return ','.join(terms) or '<none>'


def _template_containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return ((((deployment.get('spec') or {}).get('template') or {}).get('spec') or {}).get('containers') or [])


def _replicas(deployment: dict[str, Any]) -> int:
    replicas = (deployment.get('spec') or {}).get('replicas')
    return 1 if replicas is None else int(replicas)


def _status_count(name: str) -> Callable[[dict[str, Any]], int]:
    return lambda obj: int((obj.get('status') or {}).get(name) or 0)


DEPLOYMENT_COLUMNS = [
    NAME,
    column('Ready', lambda d: f'{_status_count("readyReplicas")(d)}/{_replicas(d)}',
           description='Number of the pod with ready state'),
    column('Up-to-date', _status_count('updatedReplicas'), 'integer',
           description='Total number of non-terminated pods targeted by this deployment that have the desired '
                       'template spec.'),
    column('Available', _status_count('availableReplicas'), 'integer',
           description='Total number of available pods (ready for at least minReadySeconds) targeted by this '
                       'deployment.'),
    AGE,
    column('Containers', lambda d: ','.join(c.get('name', '') for c in _template_containers(d)), priority=1,
           description='Names of each container in the template.'),
    column('Images', lambda d: ','.join(c.get('image', '') for c in _template_containers(d)), priority=1,
           description='Images referenced by each container in the template.'),
    column('Selector', lambda d: label_selector_text((d.get('spec') or {}).get('selector')), priority=1,
           description='Label selector for pods. Existing ReplicaSets whose pods are selected by this will be '
                       'the ones affected by this deployment.'),
]

NAMESPACE_COLUMNS = [
    NAME,
    column('Status', lambda n: (n.get('status') or {}).get('phase') or 'Active',
           description='The status of the namespace'),
    AGE,
]

CREATED_AT_COLUMNS = [
    NAME,
    column('Created At', lambda o: o['metadata'].get('creationTimestamp'), 'date', description=AGE_DESCRIPTION),
]

BUILTIN_COLUMNS = {
    ('', 'pods'): POD_COLUMNS,
    ('apps', 'deployments'): DEPLOYMENT_COLUMNS,
    ('', 'namespaces'): NAMESPACE_COLUMNS,
    (CRDS.group, CRDS.plural): CREATED_AT_COLUMNS,
}


def columns_for(resource: kmock.resource, crd_version: dict[str, Any] | None) -> list[Column]:
    if crd_version is not None:
        return crd_columns(crd_version)
    return BUILTIN_COLUMNS.get((resource.group or '', resource.plural), [NAME, AGE])


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == 'None':
        return None
    if include == 'Object':
        return obj
    return {'apiVersion': 'meta.k8s.io/v1', 'kind': 'PartialObjectMetadata', 'metadata': obj.get('metadata', {})}


def render(request: kmock.Request, columns: list[Column], objects: list[dict[str, Any]],
           resource_version: str | None) -> dict[str, Any]:
    """The Table of `objects` (one for a get, all for a list, one per watch event)."""
    include = request.params.get('includeObject') or 'Metadata'
    rows = []
    for obj in objects:
        row: dict[str, Any] = {'cells': [cell(obj) for _, cell in columns]}
        shown = _row_object(obj, include)
        if shown is not None:
            row['object'] = shown
        rows.append(row)
    table: dict[str, Any] = {
        'apiVersion': 'meta.k8s.io/v1', 'kind': 'Table',
        'metadata': {'resourceVersion': resource_version} if resource_version else {},
        'columnDefinitions': [dict(definition) for definition, _ in columns],
        'rows': rows,
    }
    return table
