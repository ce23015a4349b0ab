import sys

from tfdml.cli import main

sys.exit(main())
