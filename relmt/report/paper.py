"""The numbers and conventions of Shaw, Uszkoreit & Vaswani (2018) that the report sets beside relmt's."""

from enum import Enum

# relmt data set names of the paper's own corpora, and their translation direction.
PAIRS = {"wmt14_en_de": "EN-DE", "wmt_t2t_en_de": "EN-DE", "wmt14_en_fr": "EN-FR"}
POSITIONS = ("abs", "rel", "both", "none", "rope", "alibi", "t5")
# the modes without Shaw's tables, where k, a^K and a^V change nothing (rope, alibi, t5: issue 31)
TABLELESS = ("abs", "none", "rope", "alibi", "t5")
BEYOND = ("rope", "alibi", "t5")  # methods after the paper, each tested against abs and against rel
# Table 1: newstest2014 BLEU; no row for abs + rel ("both").
TABLE1 = {("base", "EN-DE"): {"abs": 26.5, "rel": 26.8}, ("big", "EN-DE"): {"abs": 27.9, "rel": 29.2},
          ("base", "EN-FR"): {"abs": 38.2, "rel": 38.7}, ("big", "EN-FR"): {"abs": 41.2, "rel": 41.5}}
# Table 2: base model, EN-DE newstest2013 BLEU against k.
TABLE2 = {0: 12.5, 1: 25.5, 2: 25.8, 4: 25.9, 16: 25.8, 64: 25.9, 256: 25.8}
# Table 3: base model, EN-DE newstest2013 BLEU; keys are (a^K on, a^V on), in the order of the rows.
TABLE3 = {(True, True): 25.8, (True, False): 25.8, (False, True): 25.3, (False, False): 12.5}
# The checkpoint the paper reports (Shaw et al. §4.1): the base model's last one, no averaging; the big
# model's average of its last 20. Tables 2 and 3 are base-model tables.
RULE = {"base": "last", "big": "averaged"}
RULE_TEXT = {"best": "best (the checkpoint with the best validation score)",
             "last": "last (the weights after the final update)",
             "averaged": "averaged (the mean of the last train.average_last step checkpoints)",
             "unknown": "unknown (neither metrics.json nor config.yaml says)"}
PAPER_RULE_TEXT = {"last": "the last checkpoint, no averaging",
                   "averaged": "the average of the last 20 checkpoints (saved every 10 minutes)"}
# metrics.json's final_valid is the validation at the end of training (the loop validates when the
# last update is done), so the valid columns always score the last checkpoint.
VALID_RULE = "last"

# The paper's findings as differences, for data sets it has no numbers for (Shaw et al. Table 1, §4.2 and Table 3).
TABLE1_DIFFERENCES = ("rel − abs = +0.3 BLEU (base) and +1.3 (big) on WMT14 EN-DE newstest2014; "
                      "+0.5 (base) and +0.3 (big) on EN-FR")
BOTH_FINDING = "abs + rel (\"both\") gave no further gain over rel (§4.2; no number given)"
TABLE2_FINDING = "k = 0 gives 12.5 BLEU, k = 1 25.5, and every k ≥ 2 25.8–25.9 (base, WMT14 EN-DE newstest2013)"
TABLE3_FINDING = ("a^K and a^V 25.8, a^K alone 25.8, a^V alone 25.3, neither 12.5 BLEU "
                  "(base, WMT14 EN-DE newstest2013)")


class PaperNumbers(str, Enum):
    """How the paper's numbers sit beside a group's tables."""

    same = "same"  # the paper's own data set (WMT): its numbers in a column, comparable metric beside them
    reference = "reference"  # the toy corpus: the EN-DE column kept for reference, marked a different data set
    differences = "differences"  # anything else (Multi30k, Europarl): the paper's differences, checked as claims


def paper_numbers(data: str) -> PaperNumbers:
    """Another corpus's BLEU is on another scale, so only the paper's own data sets get its numbers as a
    column. The toy report has always carried the EN-DE column, labelled as a different data set."""
    if data in PAIRS:
        return PaperNumbers.same
    return PaperNumbers.reference if data == "toy" else PaperNumbers.differences
