"""``python -m toolwatch``: the same entry as the ``toolwatch`` console script."""

from toolwatch.spool import main

if __name__ == "__main__":
    main()
