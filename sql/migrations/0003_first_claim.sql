-- When the current occurrence was first claimed (database clock). A recurring timer's next
-- occurrence is the first due after this moment: after downtime that skips the occurrences
-- missed meanwhile (README, recurring timers), but a re-fire after a crash, which comes a lease
-- later, skips none. A nullable column without a default: no table rewrite.
ALTER TABLE timers ADD COLUMN claimed_at timestamptz;
