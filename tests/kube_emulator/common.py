"""Helpers the emulator's modules share: API errors as `Status` objects, request headers."""

from typing import Any

import kmock


def api_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """A failure the client receives as a `Status` object with this code and reason."""
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details or None)


def bad_request(message: str) -> kmock.KubernetesError:
    return api_error(400, 'BadRequest', message)


def header(request: kmock.Request, name: str) -> str:
    """A request header by case-insensitive name (kmock keeps them as the client spelled them)."""
    wanted = name.lower()
    return next((v for k, v in request.headers.items() if k.lower() == wanted), '')


def parse_namespace_paths() -> None:
    """Makes kmock parse the paths of the Namespace resource itself.

    kmock 0.8 reads `/api/v1/namespaces/X` as "namespace X" with no resource, and fails on
    `/api/v1/namespaces` (an IndexError while unpacking), so Namespaces could not be created,
    read or watched. This wraps its path parser (module-level, used by every request it parses):
    `/api/v1/namespaces`, `/api/v1/namespaces/NAME` and `/api/v1/namespaces/NAME/status|finalize`
    name the Namespace resource; everything else is parsed by kmock as before.
    """
    from kmock._internal import parsing
    original = getattr(parsing.parse_path, '__wrapped__', parsing.parse_path)

    def parse_path(path: str) -> Any:
        parts = path.strip('/').split('/')
        if parts[:3] == ['api', 'v1', 'namespaces'] and (
                len(parts) <= 4 or (len(parts) == 5 and parts[4] in ('status', 'finalize'))):
            return parsing.ParsedPath(group='', version='v1', plural='namespaces', namespace=None,
                                      name=parts[3] if len(parts) > 3 else None,
                                      subresource=parts[4] if len(parts) > 4 else None)
        return original(path)

    parse_path.__wrapped__ = original  # type: ignore[attr-defined]
    parsing.parse_path = parse_path
