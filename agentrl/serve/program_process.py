"""The process in which `programs.AgentRunner` runs agent programs.

  python -m agentrl.serve.program_process BASE_URL HEADER TIMEOUT_S

It reads jobs from stdin, one JSON object a line: {"session", "module", "name", "task"}. Each
runs as an asyncio task, `module.name(client, task)`, where `client` is an
`openai.AsyncOpenAI` for BASE_URL bound to the session by the HEADER header. For every program
it writes one JSON line, [session, reward, why], to the stdout it was started with; `why` is
"" for a program that returned and says why otherwise. The programs' own prints go to stderr.
At EOF on stdin it cancels what still runs and ends. The API key comes in the environment
(`API_KEY_ENV`), not on the command line, where other users could read it. It imports only the
standard library, `openai` and the programs' modules.
"""
import asyncio
import functools
import importlib
import json
import logging
import os
import sys
from typing import Any, Callable

API_KEY_ENV = "AGENTRL_PROGRAM_API_KEY"


async def run_program(client, header: str, session: str, agent: Callable, task: Any,
                      write: Callable[[list], None]) -> None:
  """Runs one program and writes its [session, reward, why]."""
  try:
    reward, why = float(await agent(client.with_options(default_headers={header: session}),
                                    task)), ""
  except asyncio.CancelledError:
    reward, why = 0.0, "the program was cancelled"
  except Exception as e:  # pylint: disable=broad-except
    reward, why = 0.0, f"the program raised {type(e).__name__}: {str(e)[:200]}"
  write([session, reward, why])


async def serve(base_url: str, header: str, timeout_s: float, lines,
                write: Callable[[list], None]) -> None:
  """Runs the jobs read from `lines` until EOF."""
  # pylint: disable-next=g-import-not-at-top
  import openai  # the `serve` extra
  client = openai.AsyncOpenAI(base_url=base_url, api_key=os.environ.get(API_KEY_ENV) or "unused",
                              max_retries=0, timeout=timeout_s)
  loop, running = asyncio.get_running_loop(), set()
  while line := await loop.run_in_executor(None, lines.readline):
    job = json.loads(line)
    try:
      agent = functools.reduce(getattr, job["name"].split("."),
                               importlib.import_module(job["module"]))
    except Exception as e:  # pylint: disable=broad-except
      write([job["session"], 0.0, f"agent program {job['module']}.{job['name']} cannot be "
             f"imported in the runner's process: {type(e).__name__}: {e}"])
      continue
    task = asyncio.create_task(run_program(client, header, job["session"], agent, job["task"],
                                           write))
    running.add(task)
    task.add_done_callback(running.discard)
  for task in list(running):
    task.cancel()
  await asyncio.gather(*running, return_exceptions=True)
  await client.close()


def main() -> None:
  base_url, header, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
  for name in ("httpx", "httpx2", "openai"):   # one INFO line per request otherwise
    logging.getLogger(name).setLevel(logging.WARNING)
  # Results keep the original stdout; anything the programs print goes to stderr.
  results = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  sys.stdout = sys.stderr

  def write(item: list) -> None:
    results.write(json.dumps(item) + "\n")
    results.flush()

  asyncio.run(serve(base_url, header, timeout_s, sys.stdin, write))


if __name__ == "__main__":
  main()
