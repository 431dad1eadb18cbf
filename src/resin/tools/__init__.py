"""Tools that talk to a running server over HTTP, as any client would: the server checker
(`resin check`), the load generator (`resin bench --url`) and the terminal chat (`resin chat`).
They import nothing from `resin.server`; a test reads the imports to keep it so."""
