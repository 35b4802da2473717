"""The vocabulary every layer shares: errors, enums, verdicts, hardware facts, fp8 and cache bytes, the
canonical Case, what a backend declares (Contract) and the form a backend is handed a case in
(KernelInputs). Nothing here imports from another difftest layer."""
