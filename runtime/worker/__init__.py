"""``manage.py runworker``: the worker process (``process``), its executor slots (``slots``)
and its row in the Worker table (``registration``).
"""
