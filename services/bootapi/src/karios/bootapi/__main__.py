"""``bootapi`` / ``python -m karios.bootapi``: serve, validate a template set, print the OpenAPI."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _openapi(args: argparse.Namespace) -> int:
    from karios.bootapi.app import openapi_document

    text = json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from karios.bootapi.validate import run

    if not Path(args.dir).is_dir():
        print(f"bootapi validate: {args.dir}: not a directory", file=sys.stderr)
        return 2
    return run(Path(args.dir))


def _serve(_args: argparse.Namespace) -> int:
    from karios.bootapi.listeners import run

    run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bootapi", description="Karios bootapi")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", help="serve HTTP (and HTTPS if BOOTAPI_TLS_LISTEN_ADDR is set)").set_defaults(
        func=_serve
    )
    v = sub.add_parser("validate", help="validate a template + catalog set (for the templates repo CI)")
    v.add_argument("dir", help="directory holding catalog/ and templates/")
    v.set_defaults(func=_validate)
    o = sub.add_parser("openapi", help="print the OpenAPI document (docs/openapi/bootapi.json)")
    o.add_argument("-o", "--output", help="write to this file instead of stdout")
    o.set_defaults(func=_openapi)
    args = parser.parse_args(argv)
    if args.command is None:
        args.func = _serve
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
