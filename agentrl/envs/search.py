"""Search-R1-style retrieval env over a local BM25 index of a generated multi-hop corpus.

Search-R1 (Jin et al. 2025, arXiv 2503.09516; PeterGriffinJin/Search-R1): the model reasons,
writes <search>query</search> to get the top-k passages back as
<information>Doc 1(Title: ...) ...</information>, may search again, and ends with
<answer>...</answer>, scored by exact match after SQuAD normalisation. Here the corpus is
`envs.search_corpus` (fictional companies, people and cities whose two-hop questions need two
searches), indexed once per process per (corpus_seed, corpus_size) and shared by every env
instance and thread (`shared_index`).

Following the official code (search_r1/llm_agent/generation.py, verl/utils/reward_score/qa_em.py):
  - an action is read up to its first complete <search> or <answer> pair, whichever comes first
    (`postprocess_predictions`'s `<(search|answer)>(.*?)</\\1>`), in linear time over the last
    `extract.MAX_TEXT_CHARS` characters; a last <search> cut at the stop string "</search>"
    counts as complete (`envs.tool_calls`: Search-R1 stops generation there and adds the tag
    back), and later searches of the turn are ignored (`max_calls` = 1);
  - a turn with neither gets Search-R1's "My previous action is invalid..." observation;
  - passages are listed as `Doc {i}(Title: {title}) {text}`, top_k=3 by default;
  - EM/F1 normalise as SQuAD's evaluate-v1.1.py (lowercase, drop punctuation, drop the articles
    a/an/the, collapse whitespace); F1 is SQuAD's token-multiset F1; both take the best gold.
Reward on the answer turn: EM (`reward="em"`, Search-R1's `compute_score_em` with
format_score 0) or F1 (`reward="f1"`); info carries both. Other turns: 0.0, or
`invalid_penalty` (<= 0) for a rejected action. Search-R1 scores the last of >= 2 answer tags in
the whole rollout (its prompt holds one example); an env sees one turn, so the first pair of the
answer turn is scored.

Retrieval: BM25 Okapi through `rank_bm25` with Anserini's (pyserini's) k1=0.9, b=0.4, which
Search-R1's BM25 server uses through LuceneSearcher; rank_bm25's idf (floored at
0.25 x mean idf) and this module's tokenizer (lowercase alphanumeric runs minus a few English
stopwords, no stemming) stand in for Lucene's analyzer [INF]. Only passages with a positive
score are returned (Lucene returns only matching documents too).

Bad queries [INF]: empty, longer than `max_query_chars` (Search-R1 has no bound), or with no
searchable word get an <error> observation with info["error"] set.

Call formats (`tool_format`, `envs.tool_calls`): "tags" (the default) is Search-R1's, with its
system prompt; "hermes" calls the tool `search` with {"query": ...} in <tool_call> blocks,
answered <tool_response>Doc 1(Title: ...) ...</tool_response>, with the Hermes tool prompt.
info["progress"] is the fraction of the turn's searches that ran (the reward on the answer
turn, 0.0 for a turn with neither).
"""
import collections
import copy
import re
import string
import threading

import numpy as np

from agentrl.envs import base
from agentrl.envs import search_corpus
from agentrl.envs import tool_calls

MAX_QUERY_CHARS = 300
BM25_K1, BM25_B = 0.9, 0.4
STOPWORDS = frozenset(
    "a an the of in on at to for by and or is are was were be been which what who whom whose "
    "where when how does did do it its this that with from as has have had".split())
INVALID_ACTION = (
    "My previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.")
SYSTEM_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as you want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>.")
HERMES_INTRO = (
    "Answer the given question. Reason step by step; if you lack some knowledge, call the "
    "search engine, as often as you want: it returns the top passages for your query.")
REWARDS = ("em", "f1")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_WORD = re.compile(r"[a-z0-9]+")


def normalize_answer(text: str) -> str:
  """SQuAD normalisation: lower, strip punctuation, drop articles, collapse whitespace."""
  return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def _golds(answers) -> list[str]:
  return [answers] if isinstance(answers, str) else list(answers)


def exact_match(prediction: str, answers) -> float:
  """1.0 iff the normalised prediction equals a normalised gold (Search-R1's em_check)."""
  prediction = normalize_answer(prediction)
  return float(any(prediction == normalize_answer(gold) for gold in _golds(answers)))


def token_f1(prediction: str, answers) -> float:
  """SQuAD token F1 of the prediction against the best gold; 0.0 without a common token."""
  pred = normalize_answer(prediction).split()
  best = 0.0
  for gold in _golds(answers):
    gold = normalize_answer(gold).split()
    same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if same:
      precision, recall = same / len(pred), same / len(gold)
      best = max(best, 2 * precision * recall / (precision + recall))
  return best


def tokenize(text: str) -> list[str]:
  return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


class Index:
  """BM25 over passages (title and text); `search` returns passage ids, best first."""

  def __init__(self, passages, *, k1: float = BM25_K1, b: float = BM25_B):
    import rank_bm25  # pylint: disable=g-import-not-at-top  (the `envs` extra)
    self.passages = tuple(passages)
    self._bm25 = rank_bm25.BM25Okapi([tokenize(f"{p.title}\n{p.text}") for p in self.passages],
                                     k1=k1, b=b)

  def search(self, query: str, k: int) -> list[int]:
    # rank_bm25 scans every passage per query term: unknown terms (score 0) are skipped first.
    terms = [t for t in tokenize(query) if t in self._bm25.idf]
    if not terms:
      return []
    scores = self._bm25.get_scores(terms)
    order = np.argsort(-scores, kind="stable")[:k]  # ties: lower passage id first
    return [int(i) for i in order if scores[i] > 0]


_CACHE: dict[tuple[int, int], tuple[search_corpus.Corpus, Index]] = {}
_CACHE_LOCK = threading.Lock()


def shared_index(corpus_seed: int, corpus_size: int) -> tuple[search_corpus.Corpus, Index]:
  """(corpus, index) for (corpus_seed, corpus_size), built once per process."""
  key = (int(corpus_seed), int(corpus_size))
  with _CACHE_LOCK:
    if key not in _CACHE:
      corpus = search_corpus.make_corpus(*key)
      _CACHE[key] = (corpus, Index(corpus.passages))
    return _CACHE[key]


def format_passages(passages) -> str:
  """Search-R1's `_passages2string`: one `Doc {i}(Title: {title}) {text}` line per passage."""
  return "".join(f"Doc {i}(Title: {p.title}) {p.text}\n" for i, p in enumerate(passages, 1))


def tool(max_query_chars: int = MAX_QUERY_CHARS) -> tool_calls.Tool:
  """The search tool: one string argument, its results in <information> (the tags format)."""
  return tool_calls.Tool("search", "searches the corpus: the top passages for a query",
                         {"query": "string"}, result_tag="information",
                         max_chars=max_query_chars)


class SearchEnv:
  """Multi-turn Env: <search> gets BM25 passages, <answer> ends it with EM (or F1) reward.

  `max_calls` searches of a turn run, in order (1: Search-R1's first pair; more are ignored).
  """

  def __init__(self, *, corpus_seed: int = 0, corpus_size: int = 100, top_k: int = 3,
               max_turns: int = 4, reward: str = "em", question_kind: str = "mixed",
               invalid_penalty: float = 0.0, max_query_chars: int = MAX_QUERY_CHARS,
               tool_format: str = "tags", max_calls: int = 1):
    if reward not in REWARDS:
      raise ValueError(f"reward={reward!r} must be one of {REWARDS}.")
    if top_k < 1 or max_turns < 1 or invalid_penalty > 0 or max_query_chars < 1:
      raise ValueError(f"need top_k >= 1, max_turns >= 1, invalid_penalty <= 0 and "
                       f"max_query_chars >= 1, got {top_k}, {max_turns}, {invalid_penalty}, "
                       f"{max_query_chars}.")
    if question_kind != "mixed" and question_kind not in search_corpus.QUESTION_KINDS:
      raise ValueError(f"question_kind={question_kind!r} must be 'mixed' or one of "
                       f"{search_corpus.QUESTION_KINDS}.")
    self.corpus, self.index = shared_index(corpus_seed, corpus_size)
    self.top_k, self.max_turns, self.reward = top_k, max_turns, reward
    self.question_kind, self.invalid_penalty = question_kind, invalid_penalty
    self.max_query_chars = max_query_chars
    # Search-R1 reads an action's first pair only: later searches are ignored, not rejected.
    self.tools = tool_calls.Toolbox([tool(max_query_chars)], tool_format, max_calls=max_calls,
                                    reject_extra=False)
    self.system_prompt = (SYSTEM_PROMPT if tool_format == "tags" else
                          self.tools.system_prompt(intro=HERMES_INTRO, answer="answer"))
    self.question, self._turn, self._searches = None, 0, 0

  @base.episode_reset
  def reset(self, seed: int) -> str:
    self.question = search_corpus.make_question(self.corpus, seed, self.question_kind)
    self._turn, self._searches = 0, 0
    return f"Question: {self.question.question}"

  def clone(self) -> "SearchEnv":
    """A copy in the same state (envs/base.py, "Forking"): the turn and search counts are
    numbers; the question (replaced by reset, never changed) and the index, which every
    SearchEnv of a corpus shares (`shared_index`), are shared."""
    return copy.copy(self)

  def _info(self, reward: float, *, em: float = 0.0, f1: float = 0.0, **kwargs) -> base.Info:
    return base.make_info(reward=reward, em=em, f1=f1, answers=list(self.question.answers),
                          supporting=list(self.question.supporting), searches=self._searches,
                          turn=self._turn, **kwargs)

  def _search(self, query: str) -> list[int]:
    """The passage ids of `query`, best first; ToolError for a query that cannot run."""
    if not query:
      raise tool_calls.ToolError("empty query")
    if not tokenize(query):
      raise tool_calls.ToolError("the query has no searchable words")
    return self.index.search(query, self.top_k)

  def _invalid(self, last: bool) -> base.StepResult:
    if self.tools.fmt == "tags":
      obs, error = INVALID_ACTION, "no <search> or <answer> pair"
    else:
      error = self.tools.no_call_error("...")
      obs = f"<error>{error}</error>"
    return obs, self.invalid_penalty, last, self._info(self.invalid_penalty, error=error,
                                                       progress=0.0)

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    self._turn += 1
    last = self._turn >= self.max_turns
    turn = self.tools.parse(action)
    if turn.answer is not None and turn.answer_first:
      content = turn.answer.strip()
      em = exact_match(content, self.question.answers)
      f1 = token_f1(content, self.question.answers)
      reward = em if self.reward == "em" else f1
      return "", reward, True, self._info(reward, em=em, f1=f1, success=em == 1.0,
                                          answer=content[:200], progress=reward)
    if not turn.calls:
      return self._invalid(last)
    queries, retrieved = [], []

    def execute(call: tool_calls.Call) -> str:
      query = call.arguments["query"].strip()
      ids = self._search(query)
      queries.append(query)
      retrieved.extend(ids)
      found = format_passages(self.corpus.passages[i] for i in ids) or "No passage matches.\n"
      return found.strip()

    results = self.tools.run(turn.calls, execute)
    self._searches += len(queries)
    reward = self.invalid_penalty if results.error else 0.0
    found = dict(query=queries[0], retrieved=retrieved) if queries else {}
    return results.observation, reward, last, self._info(
        reward, error=results.error, progress=results.ok / len(turn.calls),
        tool_results=list(results.tool_results), **found)
