"""timer-service: durable multi-tenant timers on Postgres and NATS JetStream."""
