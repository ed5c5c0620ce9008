"""The store's tunables: each defined once here, with why it has its value."""

# Seconds between fsyncs of the directories batched transitions touched
# (que -> run, run -> done ...): a busy queue pays one journal commit per
# interval, not per message; a crash in between may re-run a message, never
# lose one (see the durability table in recovery.py).
FLUSH_INTERVAL = 0.5

# Message directories kept ready in .tmp/ for new messages (see SpareMaker):
# enough to absorb a burst of creates between two batches of the thread.
SPARE_DIRS = 16

# Spares made and synced together: the fsyncs of a batch share their writes,
# and the daemon's own fsyncs meet the spare thread's once a batch.
SPARE_BATCH = 8

# Seconds before making spares again after a failure (disk full, queue removed).
SPARE_RETRY = 1.0

# Bytes of spaces in a spare's blank msg: a message that fits is written over
# blocks the file already has, so fdatasync has only its data to write.
MSG_BLANK = 1024
