"""Ruble cost accounting: price catalog, dated USD->RUB rate, crash-proof ledger, planner, comparison."""
