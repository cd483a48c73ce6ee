"""A Kubernetes API server emulator on loopback, for whole-system tests of the Lifeguard operator.

Usage: python emulator.py [--port PORT] [--tokens FILE] [--crds DIR]

Serves plain HTTP on 127.0.0.1. With `--port 0` (the default) the system picks the port; the
emulator prints `listening on http://127.0.0.1:PORT` once the socket accepts connections (the
test harness reads the URL from that line).

`--tokens FILE` loads the TokenReview table, a JSON object
`{token: {username, uid, groups, extra, audiences}}`; `POST /__emulator/tokens` changes it at run
time. Admission webhooks declared by webhook configurations are called on every write; a
`clientConfig.service` is reached at the address `POST /__emulator/services` gives it (README.md). `--crds DIR` installs every CustomResourceDefinition in DIR/*.yaml before serving (by
default the repository's `crds/`, when this file sits in the repository).

Built on PyPI `kmock` (see apiserver.py for what the shim adds, README.md for what it lacks).
"""

import argparse
import asyncio
import json
import logging
import pathlib
import socket
import sys

try:
    import aiohttp.web
    import yaml

    import apiserver
except ImportError as e:  # the venv lacks the pinned packages
    sys.exit(
        f'kube emulator: cannot import {e.name!r} with {sys.executable}: install '
        'tests/interop/requirements.txt (scripts/test.sh does, into target/interop-venv)'
    )

REPO_CRDS = pathlib.Path(__file__).resolve().parent.parent.parent / 'crds'


def load_crds(directory: pathlib.Path) -> list[dict]:
    documents = []
    for path in sorted(directory.glob('*.yaml')):
        loader = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)
        documents.extend(d for d in yaml.load_all(path.read_text(), Loader=loader) if d)
    return documents


async def serve(args: argparse.Namespace) -> None:
    tokens = json.loads(pathlib.Path(args.tokens).read_text()) if args.tokens else {}
    async with apiserver.ApiServer(tokens=tokens) as server:
        crds = pathlib.Path(args.crds) if args.crds else REPO_CRDS
        if args.crds or crds.is_dir():
            await server.install_crds(load_crds(crds))

        # Bind here and hand the socket to aiohttp: no other process can take the port between
        # choosing it and listening on it. Connections made before aiohttp serves wait in the
        # backlog.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(('127.0.0.1', args.port))
        sock.listen(128)
        port = sock.getsockname()[1]

        # A client that goes away cancels its request: a dropped watch stops waiting for events.
        web_server = aiohttp.web.Server(
            server,
            handler_cancellation=True,
            access_log=logging.getLogger('kube-emulator.access'),
            access_log_format='%r %s',
        )
        runner = aiohttp.web.ServerRunner(web_server)
        await runner.setup()
        site = aiohttp.web.SockSite(runner, sock)
        await site.start()
        print(f'listening on http://127.0.0.1:{port}', flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--port', type=int, default=0, help='TCP port on 127.0.0.1 (0: any free port)')
    parser.add_argument('--tokens', help='JSON file: {token: {username, uid, groups, extra, audiences}}')
    parser.add_argument('--crds', help='directory of CRD YAML files to install (default: the repository crds/)')
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(message)s')
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == '__main__':
    main()
