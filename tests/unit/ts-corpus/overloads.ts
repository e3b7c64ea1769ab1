// expect: ["number:2","string:aa",true]
function double(x: number): number;
function double(x: string): string;
function double(x: any): any {
    return typeof x === "number" ? x * 2 : x + x;
}
function isStr(x: unknown): x is string { return typeof x === "string"; }
function assert(c: unknown): asserts c {
    if (!c) throw new Error("no");
}
assert(true);
declare const injected: number;
declare function external(x: number): void;
declare global { interface Window { x: number } }
["number:" + double(1), "string:" + double("a" as string), isStr("s")]
