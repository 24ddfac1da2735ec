"""``python -m clawstack``: the same command tree as ``claw``."""

from clawstack.cli import main

if __name__ == "__main__":
    main()
