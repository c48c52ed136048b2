"""Agent programs that misbehave on purpose, for the runner's tests (programs_test.py).

They live in a module of their own, importing nothing heavy, because the runner's process
imports a program's module: a test module would bring JAX and the models along.
"""
import os
import time


async def raises(client, task):
  await client.chat.completions.create(model="policy", messages=[
      {"role": "user", "content": "hello"}])
  raise RuntimeError(f"the program's own bug on seed {task['seed']}")


async def exits(client, task):
  del client, task
  os._exit(3)   # the runner's process dies, as with a crash or an out-of-memory kill


async def never_yields(client, task):
  await client.chat.completions.create(model="policy", messages=[
      {"role": "user", "content": "hello"}])
  time.sleep(3600)   # blocks the runner's event loop: no cancellation can reach it there
  return task["seed"]
