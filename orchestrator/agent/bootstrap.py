# The zipapp's top-level __main__: kept parseable by old interpreters so they get a clear error.
import sys

if sys.version_info < (3, 10):
    sys.stdout.write("\n@@ORCH-ENVELOPE@@{\"v\": 1, \"fatal\": {\"kind\": \"agent\", \"message\": "
                     "\"the target's python3 is %d.%d; orch's agent needs 3.10 or newer\", \"hint\": "
                     "\"install a newer python3 there or set the target's python = '/path/to/python3.10+'\"}}"
                     "@@END@@\n" % sys.version_info[:2])
    sys.exit(3)

from orchestrator.agent.__main__ import main  # noqa: E402

sys.exit(main())
