"""Operator commands: status view, holds, fences, outbox retention and reconciliation."""
