import sys

from karios.cli.main import main

sys.exit(main())
