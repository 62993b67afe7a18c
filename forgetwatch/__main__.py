import sys

from forgetwatch.cli import main

sys.exit(main())
