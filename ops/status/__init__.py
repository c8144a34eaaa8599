"""`python -m ops status`: where every job is on the capacity ladder, and why.

Three layers: `snapshot` lists the objects (the only I/O), `report` turns those plain dicts into dataclasses with pure
functions (`ladder`, `jobs`, `health`), and `render` prints a report as a table or JSON.
"""
