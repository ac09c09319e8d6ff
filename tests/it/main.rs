
mod verify;
