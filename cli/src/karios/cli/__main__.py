import sys

from karios.cli.entry import main

sys.exit(main())
