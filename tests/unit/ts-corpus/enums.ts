// expect: {"red":0,"green":5,"blue":6,"name":"Green","up":"UP","flags":6,"cnst":2}
enum Color {
    Red,
    Green = 5,
    Blue,
}
enum Dir { Up = "UP", Down = "DOWN" }
enum Flags {
    None = 0,
    A = 1 << 1,
    B = 1 << 2,
    AB = A | B,
}
const enum Small { One = 1, Two }
({ red: Color.Red, green: Color.Green, blue: Color.Blue, name: Color[5], up: Dir.Up,
   flags: Flags.AB, cnst: Small.Two })
