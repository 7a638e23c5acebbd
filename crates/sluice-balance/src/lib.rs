//! Overload balancing: JSQ and JSQ with job tagging (seed 001).
