"""Tests for agentrl.envs.search and search_corpus: EM/F1, BM25 recall, the two-hop episode."""
import os
import subprocess
import sys
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import base
from agentrl.envs import registry
from agentrl.envs import safe
from agentrl.envs import search
from agentrl.envs import search_corpus
from agentrl.envs import testing


class AnswerMetricTest(parameterized.TestCase):

  @parameterized.parameters(
      ("The  Velt River!", "velt river"), ("an Apple, a pear", "apple pear"),
      ("Theory of A.I.", "theory of ai"), ("  ", ""))
  def test_normalize_answer(self, text, want):
    self.assertEqual(search.normalize_answer(text), want)

  @parameterized.parameters(
      # (prediction, golds, EM, F1), hand-computed with SQuAD's evaluate-v1.1.py rules.
      ("the Velt river.", ["Velt River"], 1.0, 1.0),
      ("Velt", ["Velt River"], 0.0, 2 / 3),              # P = 1, R = 1/2
      ("Velt River City", ["Velt River"], 0.0, 0.8),     # P = 2/3, R = 1
      ("x x y", ["x y y"], 0.0, 2 / 3),                  # multiset overlap {x, y}: P = R = 2/3
      ("Velt", ["Velt River", "Velt"], 1.0, 1.0),        # best gold
      ("Paris", ["Velt River"], 0.0, 0.0),
      ("", ["Velt"], 0.0, 0.0),
      ("a", ["the"], 1.0, 0.0),                          # both normalise to "" (SQuAD: F1 0)
  )
  def test_exact_match_and_f1(self, prediction, golds, em, f1):
    self.assertEqual(search.exact_match(prediction, golds), em)
    self.assertAlmostEqual(search.token_f1(prediction, golds), f1, places=12)
    self.assertEqual(search.exact_match(prediction, golds[0]), float(
        search.normalize_answer(prediction) == search.normalize_answer(golds[0])))


class CorpusTest(absltest.TestCase):

  def test_corpus_is_deterministic_in_its_seed(self):
    a, b = search_corpus.make_corpus(3, 20), search_corpus.make_corpus(3, 20)
    self.assertEqual(a.passages, b.passages)
    self.assertNotEqual(a.passages, search_corpus.make_corpus(4, 20).passages)
    titles = [p.title for p in search.shared_index(0, 100)[0].passages]
    self.assertLen(set(titles), len(titles))

  def test_questions_need_both_hops(self):
    corpus, _ = search.shared_index(0, 100)
    kinds = set()
    for seed in range(200):
      q = search_corpus.make_question(corpus, seed)
      kinds.add(q.kind)
      first, second = (corpus.passages[i] for i in q.supporting)
      words = lambda p: set(search.normalize_answer(f"{p.title} {p.text}").split())
      gold = set(search.normalize_answer(q.answers[0]).split())
      self.assertFalse(gold <= words(first), (q, first))   # the answer is not in hop 1
      self.assertTrue(gold <= words(second), (q, second))  # it is in hop 2
      self.assertEqual(q.queries[1], second.title)         # hop 1 names the bridge
      self.assertIn(q.queries[1], first.text)
    self.assertEqual(kinds, set(search_corpus.QUESTION_KINDS))
    self.assertEqual(search_corpus.make_question(corpus, 5),
                     search_corpus.make_question(corpus, 5))


class IndexTest(absltest.TestCase):

  def test_bm25_recall_over_200_questions(self):
    # Measured on corpus seed 0, 100 companies (300 passages): recall@1 = recall@3 = 1.0 for
    # both hops (hop 1 queried with the question, hop 2 with the bridge entity's name), and the
    # question alone puts the hop-2 passage in its top 3 for 0 of 200 questions.
    corpus, index = search.shared_index(0, 100)
    questions = [search_corpus.make_question(corpus, seed) for seed in range(200)]
    for k, floor in ((1, 0.97), (3, 1.0)):
      for hop in (0, 1):
        hits = [q.supporting[hop] in index.search(q.queries[hop], k) for q in questions]
        self.assertGreaterEqual(sum(hits) / len(hits), floor, (k, hop))
    leaks = [q.supporting[1] in index.search(q.queries[0], 3) for q in questions]
    self.assertLessEqual(sum(leaks) / len(leaks), 0.05)

  def test_index_is_built_once_and_shared(self):
    a, b = search.SearchEnv(), search.SearchEnv(top_k=5)
    self.assertIs(a.index, b.index)
    self.assertIsNot(a.index, search.SearchEnv(corpus_size=20).index)

  def test_search_ranks_and_formats(self):
    corpus, index = search.shared_index(0, 100)
    self.assertEqual(index.search("zzzunknownword", 3), [])
    ids = index.search(corpus.passages[7].title, 3)
    self.assertEqual(ids[0], 7)
    self.assertEqual(search.format_passages([corpus.passages[7]]),
                     f"Doc 1(Title: {corpus.passages[7].title}) {corpus.passages[7].text}\n")


class SearchEnvTest(parameterized.TestCase):

  def test_episode_and_seed_contract(self):
    # After done, the gold answer paid its EM (1.0) again on every repeat.
    testing.assert_env_contract(
        self, search.SearchEnv(corpus_size=20, max_turns=2), action="<search>x</search>",
        answer=lambda env, info: f"<answer>{info['answers'][0]}</answer>")

  def test_gold_search_path_solves_every_question(self):
    env = search.SearchEnv()
    for seed in range(100):
      obs = env.reset(seed)
      self.assertEqual(obs, f"Question: {env.question.question}")
      for hop, query in enumerate(env.question.queries):
        obs, reward, done, info = env.step(f"<think>hop {hop}</think><search> {query} </search>")
        self.assertTrue(obs.startswith("<information>Doc 1(Title: "), obs[:80])
        self.assertEqual((reward, done, info["error"]), (0.0, False, ""))
        self.assertIn(env.question.supporting[hop], info["retrieved"])
        self.assertIn(env.corpus.passages[env.question.supporting[hop]].text, obs)
      _, reward, done, info = env.step(f"<answer> {env.question.answers[0]} </answer>")
      self.assertEqual((reward, done, info["success"], info["em"], info["f1"]),
                       (1.0, True, True, 1.0, 1.0), seed)

  def test_wrong_and_partial_answers(self):
    env = search.SearchEnv(question_kind="hq_river")
    env.reset(0)
    _, reward, done, info = env.step("<answer>Paris</answer>")
    self.assertEqual((reward, done, info["success"], info["f1"]), (0.0, True, False, 0.0))
    f1_env = search.SearchEnv(question_kind="hq_river", reward="f1")
    f1_env.reset(0)
    _, reward, _, info = f1_env.step(f"<answer>{f1_env.question.answers[0]} City</answer>")
    self.assertAlmostEqual(reward, 0.8)  # [river name, river, city] vs [river name, river]
    self.assertEqual((info["em"], info["success"]), (0.0, False))

  def test_first_complete_pair_decides(self):
    def first(action):
      env = search.SearchEnv(corpus_size=20)
      env.reset(0)
      obs, _, done, info = env.step(action)
      return ("answer", info["answer"]) if done else ("search", info.get("query"), obs)

    answer = search.SearchEnv(corpus_size=20)
    answer.reset(0)
    a = answer.question.answers[0]
    self.assertEqual(first(f"<answer>{a}</answer><search>b</search>"), ("answer", a))
    self.assertEqual(first(f"<search>b</search><answer>{a}</answer>")[:2], ("search", "b"))
    self.assertEqual(first(f"<search>b <answer>{a}</answer>"), ("answer", a))
    # Only the first search runs (Search-R1); a second is ignored, not an error.
    kind, query, obs = first("<search>b</search><search>c</search>")
    self.assertEqual((kind, query, obs.count("<information>")), ("search", "b", 1))

  def test_search_cut_at_its_stop_string_runs(self):
    env = search.SearchEnv()
    env.reset(0)
    query = env.question.queries[0]
    obs, reward, _, info = env.step(f"<think>first hop</think><search> {query}")
    self.assertEqual((reward, info["error"], info["query"], info["progress"]),
                     (0.0, "", query, 1.0))
    self.assertIn(env.question.supporting[0], info["retrieved"])
    self.assertEqual(info["tool_results"], [obs])

  def test_hermes_format(self):
    env = search.SearchEnv(tool_format="hermes", max_turns=3)
    env.reset(0)
    self.assertIn('"name": "search"', env.system_prompt)
    self.assertIn("<tool_call>", env.system_prompt)
    query = env.question.queries[0]
    call = '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % query
    obs, _, _, info = env.step(call)
    self.assertTrue(obs.startswith("<tool_response>Doc 1(Title: "), obs[:80])
    self.assertEqual(info["tool_results"], [obs.removeprefix("<tool_response>")
                                            .removesuffix("</tool_response>")])
    obs, reward, _, info = env.step(f"<search>{query}</search>")   # the other family's call
    self.assertEqual((reward, info["progress"]), (0.0, 0.0))
    self.assertIn("no tool call or answer", info["error"])
    self.assertEqual(obs, f"<error>{info['error']}</error>")

  def test_turn_budget(self):
    env = search.SearchEnv(max_turns=2)
    env.reset(0)
    self.assertFalse(env.step(f"<search>{env.question.queries[0]}</search>")[2])
    _, reward, done, info = env.step(f"<search>{env.question.queries[1]}</search>")
    self.assertEqual((reward, done, info["success"], info["em"]), (0.0, True, False, 0.0))

  def test_deterministic_across_instances(self):
    a, b = search.SearchEnv(), search.SearchEnv()
    self.assertEqual(a.reset(11), b.reset(11))
    self.assertEqual(a.step("<search>company founded 1950</search>"),
                     b.step("<search>company founded 1950</search>"))

  def test_bad_constructor_arguments(self):
    with self.assertRaisesRegex(ValueError, "reward="):
      search.SearchEnv(reward="bleu")
    with self.assertRaisesRegex(ValueError, "top_k"):
      search.SearchEnv(top_k=0)
    with self.assertRaisesRegex(ValueError, "question_kind"):
      search.SearchEnv(question_kind="sports")


HOSTILE = {  # name -> (action, the error it must get)
    "no_tags": ("I think it is Paris.", "no <search> or <answer> pair"),
    "empty_query": ("<search>   </search>", "empty query"),
    "only_stopwords": ("<search>the of a which</search>", "no searchable words"),
    "nul_bytes": ("<search>\x00\x00\x00</search>", "no searchable words"),
    "long_query": ("<search>" + "founder " * 50 + "</search>", "longer than 300"),
    "megabyte_query_in_window": ("<search>" + "x" * 60_000 + "</search>", "longer than 300"),
    # Its opening tag falls outside the last MAX_TEXT_CHARS characters.
    "megabyte_query": ("<search>" + "x" * 1_000_000 + "</search>", "no <search> or <answer>"),
    "many_open_tags": ("<search>" * 100_000, "no <search> or <answer>"),
    # An unclosed tag followed by other tags is no call (a cut call ends the text).
    "unclosed": ("<search>founder of <b>", "no <search> or <answer>"),
}


class HostileActionTest(parameterized.TestCase):

  @parameterized.named_parameters((name, *case) for name, case in HOSTILE.items())
  def test_bad_actions_are_quick_error_observations(self, action, message):
    env = search.SearchEnv(invalid_penalty=-0.1)
    env.reset(0)
    start = time.perf_counter()
    obs, reward, done, info = env.step(action)
    self.assertLess(time.perf_counter() - start, 1.0)
    self.assertIn(message, info["error"])
    self.assertEqual((reward, done), (-0.1, False))
    self.assertTrue(obs == search.INVALID_ACTION or obs == f"<error>{info['error']}</error>")
    self.assertLess(len(obs), 500)

  def test_nul_bytes_around_words_still_search(self):
    env = search.SearchEnv()
    env.reset(0)
    name = env.question.queries[1]
    obs, _, _, info = env.step(f"<search>\x00{name}\x00</search>")
    self.assertEqual(info["retrieved"][0], env.question.supporting[1])
    self.assertNotIn("\x00", obs)

  def test_unknown_words_get_an_empty_result(self):
    env = search.SearchEnv()
    env.reset(0)
    obs, reward, _, info = env.step("<search>qqqq zzzz</search>")
    self.assertEqual((obs, reward, info["error"]),
                     ("<information>No passage matches.</information>", 0.0, ""))

  def test_safe_env_and_registry(self):
    env = safe.SafeEnv(registry.make("search", max_turns=3))
    self.assertIn("<search>", env.system_prompt)
    env.reset(2)
    env.step("no tags")
    env.step(f"<search>{env.env.question.queries[0]}</search>")
    _, reward, done, _ = env.step(f"<answer>{env.env.question.answers[0]}</answer>")
    self.assertEqual((reward, done), (1.0, True))
    self.assertEqual((env.counters["invalid_actions"], env.counters["env_errors"]), (1, 0))
    self.assertIsInstance(registry.make("search"), base.Env)

  def test_searching_does_not_import_jax(self):
    # Env workers must stay jax-free (bm25s, the other BM25 package, imports jax).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import sys\nfrom agentrl.envs import search\nenv = search.SearchEnv()\n"
            "env.reset(0)\nenv.step('<search>company</search>')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         check=True, env=dict(os.environ, PYTHONPATH=root))
    self.assertEqual(out.stdout.strip().splitlines()[-1], "[]")


if __name__ == "__main__":
  absltest.main()
