"""The training loop and its parts: the step driver (loop), overlapped rollouts (overlap) and
an orderly stop on Ctrl-C or SIGTERM (shutdown)."""
