"""One module per dashboard page, run by ``dashboard/app.py`` through ``st.navigation``.

Not named ``pages/``: Streamlit treats a ``pages/`` folder next to the entry point as a
legacy multipage app until ``st.navigation`` runs, and could then serve a page without
the entry point (and its password gate) running first.
"""
