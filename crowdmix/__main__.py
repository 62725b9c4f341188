import sys

from crowdmix.cli import main

sys.exit(main())
