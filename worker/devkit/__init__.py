"""Tools around the service, never imported by it: throwaway servers (`embedded`), replicas as
processes and a recorder of what they fire (`harness`, `recorder`), and `timer-service dev`
(`dev`). The tests, the chaos suite and the benchmarks (tools/bench, in the repository only) use
them too."""
