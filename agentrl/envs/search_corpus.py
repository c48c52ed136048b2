"""A generated multi-hop corpus for `envs.search`: fictional companies, people and cities.

`make_corpus(corpus_seed, num_companies)` builds, deterministically in the seed, a world of
companies (industry, founding year, founder, headquarters city), people (profession, birth year,
birth city and country) and cities (country, river, mayor), and one passage per entity:

  Talvex Labs       Talvex Labs is a mining company founded in 1931 by Mira Dorvel. Its
                    headquarters are in Quelport.
  Mira Dorvel       Mira Dorvel is a chemist born in 1890 in Brennick, Zoravia.
  Quelport          Quelport is a city in Ostrenia. The Vell River flows through Quelport, and
                    its mayor is Kato Fenwir.

`make_question(corpus, seed)` draws a two-hop question about a company whose answer is in the
passage of a bridge entity named only in the company's passage ("In which country was the
founder of Talvex Labs born?": Talvex Labs -> Mira Dorvel -> Zoravia), so it needs two searches,
as the multi-hop questions Search-R1 trains on (HotpotQA, 2WikiMultiHopQA). Each question keeps
its supporting passages and a gold search path (the question, then the bridge entity's name).
All names are fresh pseudo-words (`envs.fictional`), so no model can answer from memory.
"""
import dataclasses
import random

from agentrl.envs import fictional

INDUSTRIES = ("software", "shipping", "mining", "textile", "pharmaceutical", "aerospace",
              "food", "banking", "energy", "toy", "furniture", "glass")
PROFESSIONS = ("chemist", "engineer", "architect", "pilot", "economist", "botanist", "sculptor",
               "physician", "lawyer", "astronomer", "composer", "geologist")
COMPANY_SUFFIXES = ("Industries", "Labs", "Works", "Systems", "Holdings", "Group")
QUESTION_KINDS = ("founder_city", "founder_country", "founder_profession", "hq_country",
                  "hq_mayor", "hq_river")


@dataclasses.dataclass(frozen=True)
class Passage:
  title: str
  text: str


@dataclasses.dataclass(frozen=True)
class Question:
  question: str
  answers: tuple[str, ...]     # any of them is correct
  supporting: tuple[int, int]  # passage ids, in hop order
  queries: tuple[str, str]     # a gold search per hop: the question, then the bridge's name
  kind: str


@dataclasses.dataclass(frozen=True)
class Corpus:
  passages: tuple[Passage, ...]
  companies: tuple[dict, ...]  # name, industry, year, founder (person id), hq (city id), pid
  people: tuple[dict, ...]     # name, profession, year, city (city id), pid
  cities: tuple[dict, ...]     # name, country, river, mayor (person id), pid


def _a(noun: str) -> str:
  return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def make_corpus(corpus_seed: int, num_companies: int = 100) -> Corpus:
  """The world and passages of `corpus_seed` (see the module docstring)."""
  if num_companies < 2:
    raise ValueError(f"num_companies={num_companies} must be >= 2.")
  rng = random.Random(corpus_seed)
  num_countries, num_cities = max(4, num_companies // 8), max(8, num_companies // 2)
  num_people = num_companies + num_cities  # founders, then mayors
  unique = fictional.names(rng, num_countries + 2 * num_cities + num_people + num_companies)
  # First names may repeat, like real ones; surnames and every other name are unique.
  first_names = fictional.names(rng, 30, min_syllables=2, max_syllables=2, taken=unique)
  words = iter(unique)
  countries = [next(words) for _ in range(num_countries)]
  cities = [{"name": next(words), "country": rng.choice(countries), "river": next(words),
             "mayor": num_companies + i} for i in range(num_cities)]
  people = [{"name": f"{rng.choice(first_names)} {next(words)}",
             "profession": rng.choice(PROFESSIONS), "year": rng.randint(1850, 1990),
             "city": rng.randrange(num_cities)} for _ in range(num_people)]
  companies = [{"name": f"{next(words)} {rng.choice(COMPANY_SUFFIXES)}",
                "industry": rng.choice(INDUSTRIES), "founder": i,
                # Not the founder's birth city, so no hop-1 passage holds a hop-2 answer.
                "hq": (people[i]["city"] + rng.randrange(1, num_cities)) % num_cities,
                "year": people[i]["year"] + rng.randint(20, 50)} for i in range(num_companies)]
  passages = []
  for c in companies:
    c["pid"] = len(passages)
    passages.append(Passage(c["name"], (
        f"{c['name']} is {_a(c['industry'])} company founded in {c['year']} by "
        f"{people[c['founder']]['name']}. Its headquarters are in {cities[c['hq']]['name']}.")))
  for p in people:
    p["pid"] = len(passages)
    city = cities[p["city"]]
    passages.append(Passage(p["name"], (
        f"{p['name']} is {_a(p['profession'])} born in {p['year']} in {city['name']}, "
        f"{city['country']}.")))
  for city in cities:
    city["pid"] = len(passages)
    passages.append(Passage(city["name"], (
        f"{city['name']} is a city in {city['country']}. The {city['river']} River flows "
        f"through {city['name']}, and its mayor is {people[city['mayor']]['name']}.")))
  return Corpus(tuple(passages), tuple(companies), tuple(people), tuple(cities))


def make_question(corpus: Corpus, seed: int, kind: str = "mixed") -> Question:
  """The two-hop question of `seed` about one of the corpus's companies."""
  if kind != "mixed" and kind not in QUESTION_KINDS:
    raise ValueError(f"kind={kind!r} must be 'mixed' or one of {QUESTION_KINDS}.")
  rng = random.Random(seed)
  kind = rng.choice(QUESTION_KINDS) if kind == "mixed" else kind
  company = rng.choice(corpus.companies)
  name = company["name"]
  if kind.startswith("founder"):
    bridge = corpus.people[company["founder"]]
    city = corpus.cities[bridge["city"]]
    question, answers = {
        "founder_city": (f"In which city was the founder of {name} born?", (city["name"],)),
        "founder_country": (f"In which country was the founder of {name} born?",
                            (city["country"],)),
        "founder_profession": (f"What is the profession of the founder of {name}?",
                               (bridge["profession"],)),
    }[kind]
  else:
    bridge = corpus.cities[company["hq"]]
    question, answers = {
        "hq_country": (f"In which country is the headquarters city of {name}?",
                       (bridge["country"],)),
        "hq_mayor": (f"Who is the mayor of the city where {name} has its headquarters?",
                     (corpus.people[bridge["mayor"]]["name"],)),
        "hq_river": (f"Which river flows through the city where {name} has its headquarters?",
                     (f"{bridge['river']} River", bridge["river"])),
    }[kind]
  return Question(question, answers, (company["pid"], bridge["pid"]), (question, bridge["name"]),
                  kind)
