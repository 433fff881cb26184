//! The method table: binds each domain to the router.
