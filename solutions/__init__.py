"""Reference solutions of the workbook's exercises, one module per chapter.

Each module has the same public names and signatures as the chapter's
``chapters/chNN_*/exercises.py``. Where a solution is engine code it is
imported from ``llmrs_core`` — one implementation, never two copies.
"""
