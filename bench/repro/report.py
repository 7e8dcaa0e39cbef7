"""The PASS/FAIL summary every reproduction ends with."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field


@dataclass
class Check:
    claim: str
    passed: bool
    evidence: str


@dataclass
class Checklist:
    title: str
    checks: list[Check] = field(default_factory=list)

    def check(self, claim: str, passed: bool, evidence: str = "") -> bool:
        """Record one claim with what was observed; returns passed."""
        self.checks.append(Check(claim, bool(passed), evidence))
        mark = "PASS" if passed else "FAIL"
        print(f"  [{mark}] {claim}" + (f": {evidence}" if evidence else ""), flush=True)
        return bool(passed)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def summary(self, out=sys.stdout) -> int:
        """Print the summary; the process exit code (0 = all passed)."""
        failed = [c for c in self.checks if not c.passed]
        print(f"\n{self.title}: {'PASS' if self.passed else 'FAIL'} "
              f"({len(self.checks) - len(failed)}/{len(self.checks)} checks passed)", file=out, flush=True)
        for c in failed:
            print(f"  failed: {c.claim}: {c.evidence}", file=out, flush=True)
        return 0 if self.passed else 1

    def as_dict(self) -> dict:
        return {"title": self.title, "passed": self.passed,
                "checks": [{"claim": c.claim, "passed": c.passed, "evidence": c.evidence} for c in self.checks]}
