"""Backups and restores that cannot repeat a side effect on their own (design §12b).

A restored database is behind the world: whatever its runs did after the backup's moment is
gone from the record, side effects included, and so is any proof that a call never went out.
``take`` makes a consistent online copy and records the moment first (so the copy knows it);
``put`` writes a backup over the live database; ``fence`` then holds every run that was not
finished at that moment, so each of its side effects waits for a person; ``behind`` tells a
database restored by hand (behind the newest signed checkpoint) from one that was fenced.
"""
