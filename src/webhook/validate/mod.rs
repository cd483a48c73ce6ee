//! Validating admission for McpServerPolicy, CapabilityException and PrincipalRevocation:
//! the checks CEL cannot express.
