"""Tools around the service, never imported by it: throwaway servers (`embedded`), replicas as
processes and a recorder of what they fire (`harness`, `recorder`), `timer-service dev` (`dev`)
and `timer-service bench` (`bench`). The tests and the chaos suite use them too."""
