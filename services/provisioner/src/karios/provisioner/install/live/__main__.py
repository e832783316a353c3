"""Pre-build the image method's artifacts (root archive, live kernel + initramfs):

    python -m karios.provisioner.install.live build --suite bookworm --out DIR


Mirror/proxy: ``--mirror``/``--proxy``, else ``KARIOS_PROVISIONER_IMAGE_MIRROR`` /
``KARIOS_PROVISIONER_IMAGE_PROXY``, else mmdebstrap's default mirror.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from karios.common.errors import PermanentFailure
from karios.provisioner.install.live import AptSource, ImageSettings, LiveImages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m karios.provisioner.install.live")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) root.tar.zst, vmlinuz and live.img")
    b.add_argument("--suite", default="bookworm")
    b.add_argument("--out", type=Path, required=True, help="images dir; artifacts go to OUT/<suite>/")
    b.add_argument("--mirror", default="", help="e.g. http://127.0.0.1:3142/debian")
    b.add_argument("--proxy", default="", help="HTTP proxy for apt, e.g. http://127.0.0.1:3142")
    args = parser.parse_args(argv)
    from karios.provisioner.config import ProvisionerConfig

    env = ImageSettings.from_config(ProvisionerConfig())
    source = AptSource(mirror=args.mirror or env.mirror, proxy=args.proxy or env.proxy)
    images = LiveImages(args.out, source)
    try:
        times = images.build(args.suite)
    except PermanentFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    a = images.artifacts(args.suite)
    print(
        json.dumps(
            {
                "suite": args.suite,
                "seconds": times,
                "kernel": str(a.kernel),
                "initrd": str(a.initrd),
                "root_archive": str(a.root_archive),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
