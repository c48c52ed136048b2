"""`python -m agentrl.serve`: a finished run served over the OpenAI chat API.

The run directory is written as an experiment leaves it, cheaply: the cpu smoke preset's
config.json (arithmetic, a scratch tiny model and its char tokenizer, raw-text prompts) and one
checkpoint of random params. It is served by `main.serve`, the function the command runs, on a
free port, and asked with the real `openai` client.
"""
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
import jax
import ml_collections as mlc
import numpy as np
import openai

from agentrl import checkpoint
from agentrl import configs
from agentrl import sharding
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import saved_run
from agentrl.records import rundir
from agentrl.serve import main
from agentrl.serve import messages

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run_dir(root: str, name: str, *, step: int | None = None):
  """A run directory of the cpu smoke preset (config.json, run.json), with a checkpoint of
  random params (not the init's) at `step`; returns (run_dir, config, saved params)."""
  run_dir = os.path.join(root, name)
  config = rl_config.rl_config("cpu", smoke=True)
  rundir.write_config(config, run_dir, experiment="grpo")
  rundir.unlock(run_dir)
  params = None
  if step is not None:
    other = rl_config.rl_config("cpu", smoke=True)
    other.seed = 7
    _, _, params = recipe.build_policy(other, sharding.make_mesh(other.mesh))
    saver = checkpoint.Checkpointer(os.path.join(run_dir, "ckpt"), save_every=1,
                                    async_save=False)
    saver.save(step, {"state": {"params": params}})
    saver.close()
  return run_dir, config, params


class ServeRunTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.run_dir, cls.config, cls.saved = _run_dir(cls.root, "tiny_run", step=3)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def test_a_served_request_gets_the_engines_tokens_for_its_text(self):
    serving = main.serve(self.run_dir, port=0, slots=2, max_sessions=4)
    self.addCleanup(serving.stop)
    s = serving.settings
    self.assertEqual(serving.step, "3")
    self.assertEqual((s.model_name, s.max_turns, s.max_new_tokens, s.max_len, s.temperature,
                      s.tool_format, s.chat_template, s.slots),
                     ("tiny_run", 1, 8, 24, 1.0, "hermes", False, 2))   # the run's settings
    jax.tree.map(np.testing.assert_array_equal, serving.backend.params, self.saved)
    prompt = recipe.make_task(self.config.task)().reset(recipe.EVAL_SEED_BASE)
    client = openai.OpenAI(base_url=serving.url, api_key="unused", max_retries=0)
    self.assertEqual([m.id for m in client.models.list()], ["tiny_run"])
    reply = client.chat.completions.create(
        model="tiny_run", messages=[{"role": "user", "content": prompt}], temperature=0)
    serving.stop()
    # The same engine decodes the run's own env greedily, as experiments.eval does.
    make_env, tok = recipe.make_task(self.config.task), serving.backend.tok
    seed = recipe.EVAL_SEED_BASE
    trajs, _ = serving.backend.engine.run(
        serving.backend.params, tok, [make_env(), make_env()], [seed, seed],
        rng=jax.random.key(0), greedy=True, chat_template=False, max_turns=1,
        max_new_tokens=s.max_new_tokens, max_len=s.max_len)
    t = trajs[0]
    self.assertEqual(list(t.tokens[:t.prompt_len]), tok.encode(prompt, add_bos=True))
    sampled = t.tokens[t.loss_mask > 0]
    stopped = int(sampled[-1]) in serving.backend.hub.stop_ids
    self.assertEqual((reply.usage.prompt_tokens, reply.usage.completion_tokens),
                     (t.prompt_len, len(sampled)))
    self.assertEqual(reply.choices[0].message.content or "",
                     tok.decode(sampled[:-1] if stopped else sampled))
    self.assertEqual(reply.choices[0].finish_reason, "stop" if stopped else "length")

  def test_what_a_user_can_fix_is_one_error_naming_the_flag(self):
    empty = tempfile.mkdtemp(dir=self.root)
    no_ckpt, _, _ = _run_dir(self.root, "no_ckpt")
    cases = [(empty, "latest", rf"^--run_dir='{empty}' is not a run directory"),
             (no_ckpt, "latest", r"^--step='latest': .*/ckpt holds no checkpoint"),
             (self.run_dir, "5", r"^--step='5' was not kept: .* has steps \[3\]; give one"),
             (self.run_dir, "best", r"^--step must be 'latest', 'warm_start' or a step")]
    for run_dir, step, error in cases:
      with mock.patch.object(recipe, "build_policy") as build, self.assertRaisesRegex(
          configs.ConfigError, error):
        main.serve(run_dir, step=step, port=0)
      build.assert_not_called()   # refused before anything is built
    with socket.socket() as taken:
      taken.bind(("127.0.0.1", 0))
      taken.listen()
      port = taken.getsockname()[1]
      with self.assertRaisesRegex(configs.ConfigError,
                                  rf"^--port={port}: cannot listen on 127.0.0.1:{port} .*"
                                  r"--port=0 picks a free one"):
        main.serve(self.run_dir, port=port)
    # The command prints the line alone, with exit code 2.
    out = subprocess.run([sys.executable, "-m", "agentrl.serve", f"--run_dir={empty}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    self.assertEqual(out.returncode, 2, out.stderr[-2000:])
    self.assertRegex(out.stderr.strip(), rf"^error: --run_dir='{empty}' is not a run "
                     r"directory \(it has no config\.json\); give the --workdir of an "
                     r"experiment's run$")

  def test_settings_default_to_the_runs_and_flags_override_them(self):
    run = saved_run.SavedRun(None, None, None, "3", self.config)
    s = main.settings(run, "/runs/x/", max_len=64, temperature=None, model_name="")
    self.assertEqual((s.model_name, s.max_len, s.temperature, s.slots), ("x", 64, 1.0, 64))
    with self.assertRaisesRegex(configs.ConfigError, r"^--max_new_tokens \(8\) must be < "
                                r"--max_len \(8\)"):
      main.settings(run, "/runs/x", max_len=8)
    with self.assertRaisesRegex(configs.ConfigError, r"^--tool_format must be one of"):
      main.settings(run, "/runs/x", tool_format="json")
    tc = {"name": "calculator", "tool_format": ""}
    self.assertEqual(main.env_tool_format(mlc.ConfigDict(tc)), "tags")   # the env's own
    self.assertEqual(main.env_tool_format(mlc.ConfigDict({**tc, "tool_format": "hermes"})),
                     "hermes")
    self.assertEqual(main.env_tool_format(mlc.ConfigDict({"name": "tool_use"})), "hermes")
    self.assertEqual(main.env_tool_format(mlc.ConfigDict({"name": "arithmetic"})), "hermes")

  def test_plain_rendering_of_a_first_request(self):
    opening = dict(system_prompt="Add.", user="2+2=",
                   examples=({"role": "user", "content": "1+1="},
                             {"role": "assistant", "content": "2"},
                             {"role": "user", "content": "r", "tool_results": ["r"]}))
    self.assertEqual(messages.plain(opening),
                     dict(system_prompt="", user="r\n\n2+2=",
                          examples=({"role": "user", "content": "Add.\n\n1+1="},
                                    {"role": "assistant", "content": "2"})))
    self.assertEqual(messages.plain(dict(system_prompt="", examples=(), user="2+2=")),
                     dict(system_prompt="", examples=(), user="2+2="))


if __name__ == "__main__":
  absltest.main()
