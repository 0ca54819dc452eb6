//! envoyproxy/ratelimit's `POST /json`. STUB: being written.
