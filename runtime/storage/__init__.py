"""How a run's state is written: a transition as a plan of one commit (``plan``), the
statements it becomes (``sql``), and one committer per engine, each in its engine's folder
(``sqlite``, ``postgres``), chosen by ``engines.engine()``. Storage knows no feature: the
features built on it (notifications, schedules, audit checks) plug in from above.
"""
