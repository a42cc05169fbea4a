//! `gen_durable`, the operator CLI: `gen_durable --help` lists the commands.

fn main() -> std::process::ExitCode {
    gen_durable_ops::main()
}
